// The controller: hiberd's late binding (Torpor §4.1, §5). It owns the global view of the node:
// every GPU's pool and executor, the model repository, the registered functions and their
// sessions, and the request queue, and it applies the scheduler's decisions (scheduler/
// scheduler.h): which request runs next, on which GPU, where its model comes from and what is
// evicted to make room.
//
// Executors. Each GPU runs one function at a time: the lease holder (server/lease.h). A request
// the router announced (requestArrived) waits in the scheduler's queue; when it is placed, the
// controller evicts what the decision says and grants the function's session a lease on the GPU;
// the session maps the function's blocks there and starts the swap, and the router's
// requestStart is answered as soon as the model is resident or streaming. requestDone ends the
// lease; the GPU is free once the function's work on it has drained. Calls a function makes
// outside any request (its start-up, or a program run without a router) get implicit leases the
// same way, so one scheduler sees every use of every GPU.
//
// Faults. A session that dies frees its lease, its queued requests (their waiting router calls
// get an error) and its memory. A transfer that fails marks its GPU's executor unhealthy: the GPU
// takes no more requests, the models there are forgotten (their host copies bring them back
// elsewhere), and the request that was running there gets the error as a CUDA error. A request
// whose lease ends before the router's requestDone (such a failure can beat even its
// requestStart) is kept: requestStart answers with the error, and requestDone forgets it.
//
// Threading. Everything the controller decides happens on its own thread, in the order events
// arrive: control calls (from the daemon's event loop), lease messages (from session threads)
// and swap completions (from device callbacks) are queued and handled there, so device callbacks
// never wait and nothing here needs finer locking. Replies are callbacks, called on the
// controller thread; they must not block. make_room() is the one synchronous call: the session
// thread waits for the controller, which never waits for a session.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/status.h"
#include "scheduler/scheduler.h"
#include "scheduler/topology.h"
#include "server/device/device.h"
#include "server/device_pools.h"
#include "server/function_memory.h"
#include "server/lease.h"
#include "server/model_repository.h"

namespace hiber::server {

class Session;

struct ControllerOptions {
  scheduler::SchedulerOptions scheduler;
  DevicePoolsOptions pools;
  ModelRepositoryOptions repository;
  // Transfer groups of a swap. 0: measure the elbow at start (or load it from elbow_cache).
  uint64_t swap_group_bytes = 0;
  std::string elbow_cache;            // file remembering the measured elbow; "" = none
  bool pipelined = true;
  // For functions that connect without being registered (a program run by hand).
  scheduler::Duration default_slo = 10 * scheduler::kSecond;
  uint64_t default_quota_bytes = 0;   // 0: one GPU's pool
  uint64_t max_quota_bytes = 0;       // 0: one GPU's pool
};

// What the router registers (control.capnp FunctionRegistration).
struct Registration {
  std::string function_id;
  scheduler::Duration slo = 0;
  double tail_percentile = 0.98;
  uint64_t quota_bytes = 0;           // 0: the default
  bool stateful = false;
  std::optional<bool> heavy_hint;
  scheduler::Duration exec_hint = 0;
};

// The answer to requestStart.
struct StartAnswer {
  int gpu = -1;
  scheduler::Source source = scheduler::Source::kHost;
  int source_gpu = -1;
  scheduler::PlacementRule rule = scheduler::PlacementRule::kWait;
  double queued_ms = 0;
};

// What a function's session is created with.
struct SessionPlan {
  uint64_t quota_bytes = 0;
  FunctionMemoryOptions memory;
};

// The controller's part of the status report.
struct ControllerStatus {
  struct Gpu {
    bool healthy = true;
    bool drained = false;
    std::string running;              // function id, "" when idle
    uint64_t pool_bytes = 0;
    memory::PoolStats pool;
    uint64_t swaps_in = 0;
    uint64_t swap_in_bytes = 0;
    double swap_in_seconds = 0;
    uint64_t evictions = 0;
  };
  struct Function {
    std::string function_id;
    bool registered = false;
    bool stateful = false;
    bool heavy = false;
    uint64_t model_bytes = 0;
    uint64_t host_copy_bytes = 0;
    std::vector<int> resident_gpus;
    uint64_t requests = 0;
    uint64_t on_time = 0;
    double rrc = 0;
  };
  std::vector<Gpu> gpus;
  std::vector<Function> functions;
  std::string placement, eviction, queue;
  uint64_t queued = 0;
  scheduler::SchedulerCounters counters;
  uint64_t swap_group_bytes = 0;
  memory::HostPoolStats host_pool;
  bool draining = false;
};

class Controller final : public GpuLessor {
 public:
  template <typename T>
  using Reply = std::function<void(Result<T>)>;
  struct Ok {};

  // Measures (or loads) the swap elbow, reserves every GPU's pool and the first chunk of the
  // model repository, and starts the controller thread.
  static Result<std::unique_ptr<Controller>> create(device::Device& device,
                                                    const ControllerOptions& options);
  // Stops the thread. REQUIRES: every session has ended (detach()ed).
  ~Controller() override;

  DevicePools& pools() { return *pools_; }
  ModelRepository& repository() { return *repository_; }
  uint64_t swap_group_bytes() const { return group_bytes_; }

  // ---- Sessions (the daemon's thread) ----
  // The quota and memory settings of a new session of `function_id`; an error refuses it (the
  // function already has a live instance, or asks for more than it may). A registered
  // function's instance slot is taken for `session` until detach() or withdraw().
  Result<SessionPlan> admit(const std::string& function_id, uint64_t requested_quota,
                            uint64_t session);
  // An admitted session that never started (its creation or Welcome failed).
  void withdraw(const std::string& function_id, uint64_t session);
  // The session exists (after Session::create): it may now be granted leases.
  void attach(Session* session);
  // The session ended and released everything (its thread has run teardown). Returns once the
  // controller no longer refers to it, so the caller may destroy it.
  void detach(uint64_t session);

  // ---- Control calls (any thread; replies come on the controller thread) ----
  void register_function(const Registration& registration, Reply<Ok> reply);
  void unregister_function(const std::string& function_id, Reply<Ok> reply);
  void request_arrived(const std::string& function_id, Reply<uint64_t> reply);
  void request_start(uint64_t request, Reply<StartAnswer> reply);
  void request_done(uint64_t request, bool failed, Reply<Ok> reply);
  void drain(int gpu, bool resume, Reply<Ok> reply);
  void status(Reply<ControllerStatus> reply);

  // ---- GpuLessor (session threads, device callbacks) ----
  void need_gpu(uint64_t session) override;
  void streaming(uint64_t session, uint64_t lease, const Status& status) override;
  void swap_done(uint64_t session, uint64_t lease, const Status& status,
                 const SwapReport& report) override;
  void released(uint64_t session, uint64_t lease, const Status& status) override;
  Status make_room(uint64_t session, int gpu, const memory::Shortfall& shortfall) override;

 private:
  struct State;
  using Event = std::function<void(State&)>;

  Controller(device::Device& device, const ControllerOptions& options);
  void post(Event event);
  // Runs `fn` on the controller thread and waits for its result.
  template <typename T>
  T call(std::function<T(State&)> fn);
  void run();

  // The controller thread's handlers (state_ is theirs alone).
  void on_arrived(const std::string& function_id, Reply<uint64_t>& reply);
  void on_need_gpu(uint64_t session);
  void on_streaming(uint64_t session, uint64_t lease, const Status& status);
  void on_swap_done(uint64_t session, uint64_t lease, const Status& status,
                    const SwapReport& report);
  void on_released(uint64_t session, uint64_t lease, const Status& status);
  Status on_make_room(uint64_t session, int gpu, const memory::Shortfall& shortfall);
  void on_detach(uint64_t session);
  void on_drain(int gpu, bool resume, Reply<Ok>& reply);
  ControllerStatus on_status();
  // Runs the scheduler's dispatch and carries out its decisions.
  void dispatch();
  // Frees a function's replica on a GPU (the scheduler already dropped it from its view).
  void evict(scheduler::FunctionId function, int gpu);
  // Tells the scheduler how much of `gpu` is used by anything but the replicas it placed.
  void update_reserved(int gpu);
  // The GPU's executor failed: no more requests there, its models are forgotten, the request
  // running there fails with `why`.
  void fail_gpu(int gpu, const Status& why);
  // A request left the scheduler (done or cancelled): its records go.
  void forget_request(uint64_t request);
  void answer_start(uint64_t request);
  void check_drains();
  // A stream of `gpu` for the controller's own copies.
  Result<device::Stream> service_stream(int gpu);

  device::Device& device_;
  const ControllerOptions options_;
  std::unique_ptr<DevicePools> pools_;
  std::unique_ptr<ModelRepository> repository_;
  uint64_t group_bytes_ = 0;

  // Registrations, readable from the daemon's thread for admit().
  std::mutex registry_mutex_;
  std::unordered_map<std::string, Registration> registry_;  // guarded by registry_mutex_
  std::unordered_map<std::string, uint64_t> live_instances_;  // function id -> session; guarded

  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<Event> events_;  // guarded by queue_mutex_
  bool stopping_ = false;     // guarded by queue_mutex_

  std::unique_ptr<State> state_;  // the controller thread's
  std::thread thread_;
};

}  // namespace hiber::server
