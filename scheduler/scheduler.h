// The node's scheduler: every policy decision of a node in one object, driven by events.
//
// hiberd's controller and hiber-sim drive the same Scheduler with the same calls; only the clock
// differs (hiberd's steady clock, the simulator's simulated clock). The scheduler never does
// anything itself: it answers with decisions (run request r on GPU g, bring the model from
// here, evict these replicas first) and the caller carries them out and reports back.
//
// The life of a request:
//
//   arrive(f, now)          -> RequestId; the request waits in the queue (queue.h policy)
//   dispatch(now, &out)     -> Decisions for queued requests that can start now. For each:
//                              the caller evicts `evictions` from `gpu`, then brings the model
//                              from `source` (nothing, a peer GPU, or the host) and starts it.
//   load_done(r, now, ok)   -> the model of a decision with a swap is complete on its GPU (or
//                              the swap failed). Not called for Source::kResident.
//   done(r, now, result)    -> the request finished; its GPU is available again.
//
// Call dispatch() after every event that can let a request start: an arrival, a done, a
// load_done, a GPU becoming healthy, a function registered. It returns at once when nothing
// can start. Between events the scheduler's view does not change by itself, so there is no
// timer to run (next_wakeup() says otherwise only for lazy queue policies).
//
// Policies are chosen by name (SchedulerOptions): placement ("algorithm1", "random"), spatial
// sharing ("off", "usher"),
// eviction ("heaviness", "lru", "lfu", "random", "mcache", "cremebrulee",
// "cremebrulee-oracle", "belady", "slack") and queueing ("rrc", "fifo", "gshare"), plus the
// admission rule (SchedulerOptions::shed) and prewarming (SchedulerOptions::prewarm, prewarm()).
// Unknown names are
// refused by create() with the list of known ones. Oracle policies need a FutureOracle.
//
// Memory. The scheduler's view of GPU memory is in model replicas (NodeState): a decision
// reserves model_bytes on its GPU for the replica it creates, evicting first what it must. What
// the caller uses besides models (scratch blocks, pool rounding) it reports with
// set_reserved(); when a scratch allocation fails, make_room() picks replicas to evict.
//
// Thread safety: none. One owner (hiberd's controller thread, the simulator's loop).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/eviction.h"
#include "scheduler/function_table.h"
#include "scheduler/heaviness.h"
#include "scheduler/node_state.h"
#include "scheduler/oracle.h"
#include "scheduler/placement.h"
#include "scheduler/prewarm.h"
#include "scheduler/queue.h"
#include "scheduler/topology.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

enum class ShedRule : uint8_t { kNone, kLate, kHopeless };
// "none", "late", "hopeless"; kInvalidValue for another name.
Result<ShedRule> shed_rule_from_name(std::string_view name);

struct SchedulerOptions {
  std::string placement = "algorithm1";
  std::string eviction = "heaviness";
  std::string queue = "rrc";
  // Seeds the only generator (random placement and eviction, ties nowhere else).
  uint64_t seed = 1;
  // Requests of one function that may run at once. 1 by default: a function's instance serves
  // one request at a time, and its session executes on one GPU at a time (its blocks are mapped
  // at its own addresses on the GPU that runs it).
  int per_function_concurrency = 1;
  // Admission: shed a request offered for a GPU once it cannot meet its deadline even if it
  // started now, rather than run it late (dispatch()). A late request is a miss whatever we do;
  // running it holds a GPU that punctual requests wait for and evicts models they need.
  //   kNone:     never (the paper's policies);
  //   kLate:     now + expected execution > deadline (the same test as RRC's demotion);
  //   kHopeless: now + the longer of execution and host swap > deadline when no GPU holds the
  //              model (a pipelined swap overlaps the execution, so each bounds the finish).
  ShedRule shed = ShedRule::kNone;
  // Spatial sharing. "off" (default): a GPU runs one request at a time. "usher": when placement
  // finds no available GPU, a request whose model is complete on a busy GPU may start there
  // beside what runs, if interference.h's admission rule predicts every deadline still met; of
  // several such GPUs the one with the least predicted slowdown (USHER's pairing of
  // compute-heavy with memory-heavy models), then the lowest number. Never beside a request
  // still loading its model or a background one, never outlasting the requests it joins, and
  // never for a request behind one that the same dispatch left waiting.
  std::string sharing = "off";
  // Requests that may execute on one GPU at once under sharing (>= 1).
  int max_runners_per_gpu = 2;
  // Prewarming (prewarm()): kHistogram loads the model of a function predicted to arrive soon
  // onto an idle GPU whose host link is idle, while no request waits (prewarm.h).
  PrewarmRule prewarm = PrewarmRule::kNone;
  PrewarmOptions prewarm_options;
  WindowOptions window;
  HeavinessOptions heaviness;
  EvictionOptions eviction_options;
  QueueOptions queue_options;
};

// What the caller must do to start one request.
struct Decision {
  RequestId request;
  FunctionId function;
  int gpu = -1;
  Source source = Source::kResident;
  int source_gpu = -1;  // Source::kPeer: the GPU to copy from
  PlacementRule rule = PlacementRule::kWait;
  // Replicas to free on `gpu` before the model is brought there, in order.
  std::vector<Eviction> evictions;
  // Source::kPeer only: the node is full, so the copy is a move. Once load_done reports it
  // complete, the caller frees the source replica (the scheduler has already dropped it from
  // its view by then). Keeps "at most one replica when memory is full" (§5.4).
  bool release_source = false;
  Time arrival = 0;
  uint64_t arrival_index = 0;  // 0-based order of acceptance (oracle policies)
  // A prewarm (prewarm()): a background request that loads the model from the host and runs
  // nothing; done() once the load is over frees the GPU.
  bool prewarm = false;
};

// How a request ended, as the caller saw it.
struct Completion {
  bool failed = false;  // the request did not produce an answer (counted as late)
  // Execution time with the model resident, if the caller measured it apart from the swap;
  // < 0: unknown (for a resident start the scheduler then takes dispatch -> done).
  Duration exec = -1;
};

// Where a request stands, for tools and tests.
enum class RequestState : uint8_t { kQueued, kLoading, kRunning, kFinished };

struct RequestInfo {
  std::optional<FunctionId> function;  // none once the request has finished
  RequestState state = RequestState::kFinished;
  int gpu = -1;
  Time arrival = 0;
  Time deadline = 0;
  Time dispatched = 0;
};

struct SchedulerCounters {
  uint64_t arrivals = 0;    // requests of the functions' callers (not background ones)
  uint64_t background = 0;  // background requests (arrive(..., background = true))
  uint64_t dispatched = 0;  // requests started, background ones included
  uint64_t completed = 0;   // callers' requests that ended (done, or cancelled once dispatched)
  uint64_t on_time = 0;     // of those, within their SLO and not failed
  uint64_t failed = 0;      // of those, failed (a cancelled dispatched request is one)
  uint64_t cancelled = 0;   // cancel(), and queued requests of unregistered functions
  uint64_t rejected = 0;    // shed by dispatch() (SchedulerOptions::shed); not in completed
  uint64_t prewarms = 0;    // prewarm() loads, also counted in background and host_swaps
  uint64_t prewarm_evictions = 0;  // replicas prewarms evicted, also counted in evictions
  uint64_t resident_starts = 0;
  uint64_t shared_starts = 0;  // of those, beside another request (SchedulerOptions::sharing)
  uint64_t peer_swaps = 0;
  uint64_t host_swaps = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
};

class Scheduler {
 public:
  // kInvalidValue for an unknown policy name (listing the known ones), an oracle policy
  // without `oracle`, or bad options. `topology` and `oracle` must outlive the scheduler.
  static Result<std::unique_ptr<Scheduler>> create(const Topology& topology,
                                                   const SchedulerOptions& options,
                                                   const FutureOracle* oracle = nullptr);
  ~Scheduler();

  // ---- Functions ----
  // kInvalidValue for a bad spec (including a model larger than every GPU) or an id already
  // registered.
  Status register_function(FunctionId id, const FunctionSpec& spec, Time now);
  // Forgets the function: its queued requests are cancelled (appended to `cancelled`, which may
  // be null), its replicas dropped from the view (the caller frees its memory). kIllegalState
  // while one of its requests is loading or running; kNotFound if unknown.
  Status unregister_function(FunctionId id, Time now, std::vector<RequestId>* cancelled);
  // The model's size changed (hiberd learns it when the first run ends). Resizes its replicas
  // in the view; a GPU may end up over-committed, which the next decisions evict away.
  // kNotFound if unknown; kInvalidValue for 0 or a size no GPU can hold (nothing changes).
  Status set_model_bytes(FunctionId id, uint64_t bytes);

  // ---- Requests ----
  // kNotFound for an unknown function. A background request is the function's own use of a
  // GPU outside its callers' requests (hiberd: its start-up, or a program run without a
  // router): it queues, is placed and holds its GPU like any request, but it is not one of
  // the function's requests for its SLO, its rates or its execution times (RRC, demand and
  // heaviness's execution mean ignore it; its swaps still count as swaps).
  Result<RequestId> arrive(FunctionId id, Time now, bool background = false);
  // Appends to `out` a decision for every queued request that can start now, in the queue
  // policy's order, and updates the view as if each were carried out. A lazy policy (gshare)
  // may hold a request back for a GPU about to free; next_wakeup() says until when.
  // With SchedulerOptions::shed and `rejected` given, a caller's request that the queue offers
  // when it can no longer meet its deadline (see shed) leaves the queue instead of starting:
  // its id is appended to `rejected`, and the caller answers it "overloaded". It counts as
  // completed late in the function's window (RRC), never as on time.
  void dispatch(Time now, std::vector<Decision>* out, std::vector<RequestId>* rejected = nullptr);
  // With SchedulerOptions::prewarm and no request queued: appends a decision for each model
  // worth loading onto an idle GPU now (plan_prewarm() in prewarm.h: never evicting a model
  // predicted to be used as soon, never onto a GPU or PCIe switch that is busy), and updates the
  // view as dispatch() does. Each is a background request (Decision::prewarm) with a host load:
  // the caller reports load_done() and then done() as for any other.
  void prewarm(Time now, std::vector<Decision>* out);
  // The swap of a dispatched request finished. With ok == false the new replica is dropped
  // (the request still holds its GPU until done()). kNotFound for a request not loading.
  Status load_done(RequestId request, Time now, bool ok);
  // The request finished; its GPU is available. kNotFound for a request not dispatched. A
  // request still loading is taken to have failed its load first (as load_done(ok = false)).
  Status done(RequestId request, Time now, const Completion& completion = {});
  // Withdraws a request: queued ones leave the queue; dispatched ones end as failed (their GPU
  // is released, a loading replica dropped). kNotFound for a finished or unknown request.
  Status cancel(RequestId request, Time now);

  // ---- Memory and GPUs ----
  // A GPU number outside the node is ignored by the void calls below (make_room: false).
  // Bytes of GPU g used by anything but models.
  void set_reserved(int gpu, uint64_t bytes);
  // Picks replicas on `gpu` to evict so that at least `bytes` are free there afterwards
  // (NodeState::free_bytes(gpu) >= bytes; an over-committed GPU gives up its excess too), never
  // one of `keep`'s or one that is executing, loading or a copy's source; drops them from the
  // view and appends them to `out`. true with nothing evicted when `bytes` are free already;
  // false (and nothing changed) if that cannot make room.
  bool make_room(int gpu, uint64_t bytes, FunctionId keep, Time now, std::vector<Eviction>* out);
  // The caller lost a replica outside a decision (a failed GPU, a freed function).
  void drop_replica(int gpu, FunctionId id);
  // An unhealthy GPU gets no requests and loses its replicas from the view; running requests
  // there are still reported done/cancelled by the caller.
  void set_gpu_healthy(int gpu, bool healthy);
  // A held GPU gets no requests until released; it keeps its replicas in the view, and a request
  // running there goes on.
  void set_gpu_held(int gpu, bool held);

  // ---- Views ----
  // The earliest time a lazy queue policy wants dispatch() called although no event happened,
  // or, with prewarming and nothing queued, when the next prewarm falls due (the caller then
  // calls prewarm(), which NodeCore::dispatch does); kNever otherwise.
  static constexpr Time kNever = INT64_MAX;
  Time next_wakeup() const;
  // A request that has finished (or was cancelled) reads as kFinished with nothing else known;
  // kNotFound for an id this scheduler never issued.
  Result<RequestInfo> request(RequestId request) const;
  size_t queued() const;
  const NodeState& node() const;
  const FunctionTable& functions() const;
  const SchedulerCounters& counters() const;
  // RRC of a function now (queue.h), for tools and tests; 0 for an unknown function.
  double rrc(FunctionId id, Time now) const;
  // Every invariant of the view and the queue; kIllegalState naming the first broken one.
  Status check_invariants() const;

 private:
  struct Impl;
  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hiber::scheduler
