// The node core: every decision a Hiber node makes about its GPUs, in one single-threaded object
// that both hiberd and hiber-sim drive. It holds the scheduler (scheduler/scheduler.h), the
// node's functions and their requests as a state machine, the GPUs' health and drains, and the
// reserve accounting that keeps the scheduler's view of memory true to the pools. It decides
// what to evict, what to load, what to start and when a request is over; it acts only through an
// Actuator, which carries the decisions out and reports back:
//
//   hiberd (server/controller.cc): grants a session a lease on the GPU, swaps the model with
//     FunctionMemory, ends the lease when the router says the request is done;
//   hiber-sim (sim/hiber_node.cc): allocates the model's blocks in the real pools, moves its
//     bytes over the modelled links, finishes the request after its execution time.
//
// So the simulator measures the code that runs in production: only the actuators differ.
//
// The core is pure: no threads, no clock (every call is given `now`, nanoseconds on the caller's
// clock), no I/O. The actuator may call back into the core from inside an actuator call (the
// simulator allocates a model's blocks inside start() and asks make_room() when the pool is
// full; a start that fails reports streaming() and released() at once); the core is written
// for that. The actuator's calls carry no time: it knows it from the call into the core that led
// to them.
//
// The life of a request (Phase):
//
//   arrive() / need_gpu()   kQueued     waits in the scheduler's queue
//   dispatch()              kPlacing    placed on a GPU: evictions done, Actuator::start() called
//   streaming(ok)           kRunning    the model is resident or streaming in; start answered
//   done()                  kEnding     the caller's answer came; Actuator::end() drains the work
//   released()                          the GPU is free again; the request is forgotten, or, if
//                           kEnded      nobody has said done() yet (its GPU failed, say), kept
//                                       ended until done() so that the caller learns how it went
//
// With spatial sharing (SchedulerOptions::sharing) a GPU may execute several requests at once:
// one is its running request, the others share it, and when the running one is released the
// first of them takes its place. Each is started, ended and released on its own.
//
// Functions and instances. A function (add_function) is what callers ask for; an instance
// (attach) is a process that serves it, with its own address range, blocks and copy of the
// model. A function may have several instances at once: each runs one request at a time, so two
// requests of one function run at once on two GPUs, each with its instance's copy. The core
// chooses the instance of a request that names none (arrive), and the scheduler places each
// instance's requests and replicas as it places a function's: to the scheduler every instance
// slot of a function is an entry of its own (its queue, replicas and statistics). A slot
// outlives its instance, so a function's statistics survive its instances' restarts; an
// instance that attaches takes its function's first free slot. hiber-sim's functions have one
// instance each.
//
// A background request (need_gpu: the instance's own use of a GPU outside its callers' requests,
// such as its start-up) is forgotten at released(); nobody waits for it. With a lease slice
// (NodeOptions::lease_slice) dispatch() preempts one that has run for a slice while other
// functions wait: it ends like any request, and its model stays on the GPU as a replica that the
// eviction policy may take like any other.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/gpu_set.h"
#include "common/histogram.h"
#include "common/ids.h"
#include "common/status.h"
#include "scheduler/scheduler.h"
#include "scheduler/topology.h"

namespace hiber::node {

using scheduler::Duration;
using scheduler::Time;

struct NodeOptions {
  scheduler::SchedulerOptions scheduler;
  // Per GPU: bytes models can never use because they are outside the pools (the CUDA context,
  // the pool's rounding to the granularity). The scheduler's reserve starts there.
  std::vector<uint64_t> outside_pool_bytes;
  // A background request (need_gpu) that has held its GPU this long gives it up when requests
  // of other functions wait: dispatch() ends it (Actuator::end), and the function's next need
  // for a GPU queues behind them. 0: background requests run until they end by themselves.
  Duration lease_slice = 0;
};

// What the caller knows about a function when it adds it.
struct FunctionSpec {
  std::string name;          // for logs and status
  uint64_t model_bytes = 1;  // the model's size; 1 until a first run shows it (hiberd)
  Duration slo = 0;
  double tail_percentile = 0.98;
  std::optional<bool> heavy_hint;
  Duration exec_time_hint = 0;
  // What a request asks of a GPU while it runs alone, for spatial sharing; none: unknown.
  std::optional<scheduler::Intensity> intensity;
  // Every block is state: a copy between GPUs is always a move (one replica only).
  bool stateful = false;
};

// What the actuator must do to start a request: bring the instance's model onto `gpu` from
// `source` (nothing to bring when resident) and run the request there.
struct Start {
  RequestId request;
  InstanceId instance;  // runs it
  FunctionId function;  // the instance's
  GpuId gpu;
  scheduler::Source source = scheduler::Source::kResident;
  std::optional<GpuId> source_gpu;  // Source::kPeer: the GPU holding the replica to copy
  // Source::kPeer: the copy is a move. Once swap_done() reports it complete, the core has the
  // actuator forget() the source replica.
  bool release_source = false;
  bool background = false;  // need_gpu(), not a caller's request
  // A background request of nobody (SchedulerOptions::prewarm): load the model, run nothing,
  // release the GPU once the swap is over. hiberd refuses to run with prewarming.
  bool prewarm = false;
  // The function's first caller request: what it loaded before is its model (hiberd fixes it).
  bool first_request = false;
  scheduler::PlacementRule rule = scheduler::PlacementRule::kWait;
};

// The answer the caller of await_start() gets once the request runs.
struct StartInfo {
  GpuId gpu;
  scheduler::Source source = scheduler::Source::kResident;
  std::optional<GpuId> source_gpu;
  scheduler::PlacementRule rule = scheduler::PlacementRule::kWait;
  Duration queued = 0;  // arrival to the answer
};

// What a finished swap moved.
struct SwapStats {
  uint64_t bytes = 0;
  Duration duration = 0;
};

class Actuator {
 public:
  virtual ~Actuator() = default;

  // Frees `instance`'s replica on `gpu`; its host copy is authoritative, so only state that must
  // survive is written back. Returns the bytes freed. An error other than kIllegalState means
  // the GPU failed (a write-back did not complete).
  virtual Result<uint64_t> evict(InstanceId instance, GpuId gpu) = 0;
  // Frees `instance`'s replica on `gpu` without writing anything back: its GPU failed, or its
  // bytes were moved to another GPU.
  virtual void forget(InstanceId instance, GpuId gpu) = 0;
  // Starts a request (evictions are done). The actuator reports streaming() when the model is
  // resident or streaming in (or the start failed), swap_done() when a swap ends, and
  // released() when the request's work has drained and the GPU is free.
  virtual void start(const Start& start) = 0;
  // The request must end: drain its work and report released(). `failure` is ok for an
  // ordinary end; otherwise the request's GPU failed and its work is lost.
  virtual void end(RequestId request, InstanceId instance, const Status& failure) = 0;
  // The answer to await_start(): the request runs, or why it never will.
  virtual void answer_start(RequestId request, const Result<StartInfo>& answer) = 0;
  // The scheduler shed the request (SchedulerOptions::shed): it will never run. `why` is the
  // "overloaded" error await_start() answers (now, if it waits); the caller still says done().
  virtual void rejected(RequestId request, InstanceId instance, const Status& why) = 0;
  // A drain() finished: `gpu`, or the whole node when none.
  virtual void drained(std::optional<GpuId> gpu) = 0;

  // ---- Memory, for the reserve accounting ----
  // Bytes `gpu`'s pool has given out, to anything.
  virtual uint64_t pool_allocated(GpuId gpu) const = 0;
  // Bytes of `instance`'s blocks placed on `gpu`.
  virtual uint64_t placed_bytes(InstanceId instance, GpuId gpu) const = 0;
  // The instance's model size as its memory knows it now (asked when a request arrives, and
  // when one releases).
  virtual uint64_t model_bytes(InstanceId instance) const = 0;
};

// The link a swap brings a model over.
enum class SwapLink : uint8_t { kNvlink, kPcie, kHost };
inline constexpr size_t kSwapLinks = 3;
const char* swap_link_name(SwapLink link);  // "nvlink", "pcie", "host"
// The link a model from `source` takes onto `gpu`: a peer copy goes over NVLink (or NVSwitch)
// when the topology has a direct link, else over PCIe; none for a resident model.
std::optional<SwapLink> swap_link(const scheduler::Topology& topology, scheduler::Source source,
                                  int source_gpu, int gpu);

// Why a replica left a GPU.
enum class EvictionReason : uint8_t {
  kPlacement,  // room for a model the scheduler placed there
  kMemory,     // a running function needed more memory than was free (make_room)
  kDrain,      // the GPU was drained
};
inline constexpr size_t kEvictionReasons = 3;
const char* eviction_reason_name(EvictionReason reason);  // "placement", "memory", "drain"

// Where a request stands.
enum class Phase : uint8_t { kQueued, kPlacing, kRunning, kEnding, kEnded };

// A point-in-time view for status reports.
struct NodeStatus {
  struct Gpu {
    bool healthy = true;
    bool drained = false;
    std::optional<InstanceId> running;
    std::vector<InstanceId> sharing;  // executing beside `running` (spatial sharing)
    uint64_t swaps_in = 0;
    uint64_t swap_in_bytes = 0;
    double swap_in_seconds = 0;
    uint64_t evictions = 0;
    std::array<uint64_t, kEvictionReasons> evictions_by_reason{};  // by EvictionReason
  };
  struct LinkSwaps {
    uint64_t swaps = 0;
    uint64_t bytes = 0;
  };
  // A function, its instances' slots summed.
  struct Function {
    FunctionId id;
    std::string name;
    std::vector<InstanceId> instances;  // attached, in increasing order
    bool stateful = false;
    bool heavy = false;  // any slot's
    uint64_t requests = 0;
    uint64_t on_time = 0;
    double rrc = 0;                    // the highest slot's
    std::vector<GpuId> resident_gpus;  // where any of its instances has a replica
  };
  std::vector<Gpu> gpus;
  std::vector<Function> functions;  // by id
  // The function of every attached instance: what Gpu::running names.
  std::vector<std::pair<InstanceId, FunctionId>> instances;  // by instance
  uint64_t queued = 0;
  scheduler::SchedulerCounters counters;
  bool draining = false;
  std::array<LinkSwaps, kSwapLinks> swaps_by_link{};  // finished swaps, by SwapLink
  Histogram swap_seconds{swap_seconds_bounds()};      // per finished swap
  uint64_t preemptions = 0;  // background requests ended at the end of their lease slice
};

class NodeCore {
 public:
  // `topology`, `actuator` and `oracle` must outlive the core. The oracle is needed only by the
  // oracle eviction policies.
  static Result<std::unique_ptr<NodeCore>> create(const scheduler::Topology& topology,
                                                  const NodeOptions& options, Actuator& actuator,
                                                  const scheduler::FutureOracle* oracle = nullptr);
  ~NodeCore();
  NodeCore(const NodeCore&) = delete;
  NodeCore& operator=(const NodeCore&) = delete;

  // ---- Functions and instances ----
  // The ids at and above this one are the core's own (its scheduler entries for instance slots
  // beyond a function's first); add_function refuses them.
  static constexpr uint32_t kFirstOwnId = uint32_t{1} << 31;
  // kInvalidValue for a bad spec, an id in use or one at or above kFirstOwnId. The caller numbers
  // its functions.
  Status add_function(FunctionId id, const FunctionSpec& spec, Time now);
  // Forgets the function and cancels its queued requests. kIllegalState while it has an
  // instance attached; kNotFound if unknown.
  Status remove_function(FunctionId id, Time now);
  bool has_function(FunctionId id) const;
  // `instance` can run `function`'s requests (hiberd: a connected session). kNotFound for an
  // unknown function; kInvalidValue for an instance attached already.
  Status attach(InstanceId instance, FunctionId function, Time now);
  // The instance is gone, and its memory with it: its queued requests are withdrawn, a running
  // one ends as failed, waiting await_start()s are answered with an error. Unknown: nothing.
  void detach(InstanceId instance, Time now);
  // The function `instance` serves, while it is attached.
  std::optional<FunctionId> function_of(InstanceId instance) const;

  // ---- Requests ----
  // A caller's request of `function`, for `instance` when the caller has already sent it to
  // that process (hiber-router names the worker's instance), or for the instance the core
  // chooses: the one with the fewest of its callers' requests not yet done, among those one
  // whose model is on a GPU already, then the one attached first. kNotFound for an unknown
  // function; kDeviceUnavailable when the node drains, the function has no instance, or
  // `instance` is not one of its instances.
  Result<RequestId> arrive(FunctionId function, std::optional<InstanceId> instance, Time now);
  // The instance the request runs on, until it is forgotten.
  std::optional<InstanceId> instance_of(RequestId request) const;
  // The instance needs a GPU outside any caller's request: a background request is queued
  // unless it holds or awaits one already.
  void need_gpu(InstanceId instance, Time now);
  // The caller waits for `request` to run: Actuator::answer_start() answers, now or later.
  // kNotFound for a request not waiting (unknown, finished, background); kInvalidValue when
  // somebody waits already.
  Status await_start(RequestId request, Time now);
  // The caller's request is over (`failed`: it produced no answer). A queued one leaves the
  // queue; a running one ends (Actuator::end); an ended one is forgotten. kNotFound otherwise.
  Status done(RequestId request, bool failed, Time now);

  // ---- Reports from the actuator ----
  // The request's model is resident or streaming in (ok), or the start failed. `moves_nothing`:
  // the start found every byte of the model in place (a function's first lease, before it has a
  // model to bring; blocks already on the GPU): the start is answered as resident and no swap is
  // counted, whatever the placement expected.
  void streaming(RequestId request, const Status& status, Time now, bool moves_nothing = false);
  // The request's swap finished (or failed: its GPU is taken out of service).
  void swap_done(RequestId request, const Status& status, const SwapStats& stats, Time now);
  // The request's work has drained; its GPU is free.
  void released(RequestId request, const Status& status, Time now);
  // `instance` needs `bytes` more on `gpu` than its pool can give: the eviction policy frees
  // other replicas there. kOutOfMemory when nothing it may evict is left.
  Status make_room(InstanceId instance, GpuId gpu, uint64_t bytes, Time now);
  // The actuator's memory on `gpu` changed outside a core call (blocks allocated or freed).
  void memory_changed(GpuId gpu);
  // A transfer on `gpu` failed: it takes no more requests, its replicas are forgotten, and the
  // request running there ends with `why`.
  void fail_gpu(GpuId gpu, const Status& why);
  // While held, `gpu` takes no new requests; its replicas stay where they are, and whatever
  // runs there goes on (hiberd: a shared context being reset after a fault). kInvalidDevice for
  // a GPU outside the node.
  Status hold_gpu(GpuId gpu, bool hold);

  // ---- Operators ----
  // Drains `gpu` (its replicas leave; it takes no requests) or, with none, the node (no new
  // requests). Actuator::drained() reports the end. `resume` undoes it at once, and nothing is
  // reported. kInvalidDevice for a GPU outside the node.
  Status drain(std::optional<GpuId> gpu, bool resume);

  // ---- Decisions ----
  // Preempts background requests past their slice while others wait, starts every queued
  // request that can start now, and finishes drains that are complete. Call it after every
  // batch of events.
  void dispatch(Time now);
  // When dispatch() must run even if nothing happens (lazy queue policies, a lease slice that
  // ends); kNever otherwise.
  Time next_wakeup() const;

  // ---- Views ----
  std::optional<Phase> phase(RequestId request) const;
  // The request running on `gpu`; with spatial sharing, others may execute beside it.
  std::optional<RequestId> running(GpuId gpu) const;
  NodeStatus status(Time now) const;
  const scheduler::Scheduler& scheduler() const { return *scheduler_; }
  int gpu_count() const;

 private:
  struct State;

  NodeCore(const scheduler::Topology& topology, const NodeOptions& options, Actuator& actuator);

  void start_one(const scheduler::Decision& decision, Time now);
  // With SchedulerOptions::prewarm: starts the scheduler's prewarm loads, each a background
  // request that loads a model for nobody (Start::prewarm).
  void prewarm(Time now);
  // The scheduler shed a queued request: it ends unstarted, answered "overloaded".
  void reject(RequestId id, Time now);
  // Ends background requests that have held their GPU for a slice, at most as many as there
  // are other functions' requests waiting and not already covered by a GPU being freed.
  void preempt(Time now);
  // When the earliest background request that preempt() could end reaches its slice, if any
  // request waits; kNever otherwise.
  Time slice_end() const;
  // Evicts the replica of the slot the scheduler calls `slot` (an id of its), if an instance
  // holds the slot.
  void evict(FunctionId slot, GpuId gpu, EvictionReason reason);
  // Tells the scheduler the model size the slot's instance reports, if it changed.
  void learn_model_bytes(FunctionId slot);
  // A new slot of `function` in the scheduler, with the function's spec.
  Result<FunctionId> add_slot(FunctionId function, Time now);
  // Tells the scheduler how much of `gpu` is used by anything but the replicas it placed.
  void update_reserved(GpuId gpu);
  // `gpu`'s reserve may have changed: update_reserved() before the next decision.
  void reserve_changed(GpuId gpu);
  void refresh_reserves();
  void answer_start(RequestId id, Time now);
  void check_drains();

  const scheduler::Topology& topology_;
  const NodeOptions options_;
  Actuator& actuator_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<State> state_;
  std::vector<scheduler::Decision> decisions_;  // dispatch()'s scratch
  std::vector<RequestId> rejected_;             // dispatch()'s scratch
};

}  // namespace hiber::node
