// The controller: hiberd's late binding (Torpor §4.1, §5), as the node core's actuator. The node
// core (node/node_core.h) makes every decision: which request runs next, on which GPU, where its
// model comes from and what is evicted to make room; the simulator drives the same core. The
// controller owns what the core must not: the thread that serialises its events, the clock,
// every GPU's pool, the model repository, the registered functions and their sessions, and the
// replies to the router's control calls. It carries the core's decisions out (node::Actuator):
//
//   start   grants the function's session a lease on the GPU; the session maps the function's
//           blocks there and starts the swap, and reports streaming, swap_done and released;
//   end     ends the session's lease (the router's requestDone) or fails it (its GPU failed);
//   evict   writes back dirty state and frees the function's blocks on a GPU (FunctionMemory);
//   forget  frees them without writing back (a failed GPU, a finished move).
//
// Calls a function makes outside any request (its start-up, or a program run without a router)
// get background requests the same way, so one scheduler sees every use of every GPU.
//
// Instances. A registered function may have several instances at once, each a process with a
// session of its own (the router scales a hot function's workers up to its max_instances). The
// controller numbers each admitted session's instance (InstanceId) and attaches it to its
// function in the node core, which schedules instances: each has its own address range, blocks,
// replicas and queue, so two instances run at once on two GPUs, each with its own copy of the
// model (a VMM address maps one allocation, so two GPUs running one function at once need two
// address ranges; docs/design.md, "Functions and instances"). requestArrived names the instance
// that will serve the request (its Hello's instance key), so the lease goes to the process that
// gets the request; without a key the node core chooses. Status reports each function once, its
// instances summed.
//
// Faults. A session that dies frees its lease, its queued requests (their waiting router calls
// get an error) and its memory. With --isolation=shared, a fault that ended a GPU's shared
// context (a lease released with a context fault) has the controller reset it: the GPU is held
// (it takes no new requests, its models stay), every session forgets its objects in that
// context (LeaseHolder::forget_shared_context), then the device resets it
// (Device::reset_shared_context) and the GPU takes requests again. Only the requests that ran
// in the context when it faulted failed. (With --isolation=context the fault ended the
// instance's own context, which the session gives back to be destroyed.) A transfer that fails
// marks its GPU unhealthy: the GPU takes no more requests, the models there are forgotten (their
// host copies bring them back elsewhere), and the request that was running there gets the error as
// a CUDA error. A request whose lease ends before the router's requestDone (such a failure can beat
// even its requestStart) is kept: requestStart answers with the error, and requestDone forgets it.
//
// Threading. Everything the core decides happens on the controller's thread, in the order events
// arrive: control calls (from the daemon's event loop), lease messages (from session threads)
// and swap completions (from device callbacks) are queued and handled there, so device callbacks
// never wait and nothing here needs finer locking. Replies are callbacks, called on the
// controller thread; they must not block. make_room() is the one synchronous call: the session
// thread waits for the controller, which never waits for a session.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/ids.h"
#include "common/mailbox.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/node_core.h"
#include "scheduler/scheduler.h"
#include "scheduler/topology.h"
#include "server/context_pool.h"
#include "server/device/device.h"
#include "server/device_pools.h"
#include "server/function_memory.h"
#include "server/lease.h"
#include "server/model_repository.h"
#include "wire/control_types.h"

namespace hiber::server {

struct Registration;

struct ControllerOptions {
  scheduler::SchedulerOptions scheduler;
  // Told of every registration made or removed (the controller thread): hiberd keeps them in
  // its state directory (server/session_store.h).
  std::function<void(const Registration&)> registered;
  std::function<void(const std::string& function_id)> unregistered;
  DevicePoolsOptions pools;
  ModelRepositoryOptions repository;
  // Transfer groups of a swap. 0: measure the elbow at start (or load it from elbow_cache).
  uint64_t swap_group_bytes = 0;
  std::string elbow_cache;  // file remembering the measured elbow; "" = none
  bool pipelined = true;
  // For functions that connect without being registered (a program run by hand).
  scheduler::Duration default_slo = 10 * scheduler::kSecond;
  uint64_t default_quota_bytes = 0;  // 0: one GPU's pool
  uint64_t max_quota_bytes = 0;      // 0: one GPU's pool
  // Registered functions at most; each costs the scheduler and every status report. 0: no cap.
  uint64_t max_registered_functions = 4096;
  // Connected instances of one registered function at most (each holds a quota of its own).
  // 0: no cap.
  uint32_t max_instances_per_function = 64;
  // The longest one kernel may run: the larger of this and the function's SLO (a kernel never
  // needs longer than its whole request may take). 0: no limit at all.
  scheduler::Duration kernel_deadline = 0;
  // An implicit lease held this long gives its GPU up when other functions wait (node/'s
  // NodeOptions::lease_slice). 0: never.
  scheduler::Duration lease_slice = 0;
  // The sessions' contexts (server/context_pool.h): in kShared mode the controller resets a
  // GPU's shared context after a fault ends it.
  Isolation isolation = Isolation::kContext;
};

// What the router registers (control.capnp FunctionRegistration).
struct Registration {
  std::string function_id;
  scheduler::Duration slo = 0;
  double tail_percentile = 0.98;
  uint64_t quota_bytes = 0;  // 0: the default
  bool stateful = false;
  std::optional<bool> heavy_hint;
  scheduler::Duration exec_hint = 0;
};

// What a function's session is created with.
struct SessionPlan {
  InstanceId instance{0};  // the session's instance; it owns the session's blocks
  uint64_t quota_bytes = 0;
  FunctionMemoryOptions memory;
  std::chrono::nanoseconds kernel_deadline{0};  // 0: none
};

// The controller's part of the status report.
struct ControllerStatus {
  struct Gpu {
    bool healthy = true;
    bool drained = false;
    std::string running;  // function id, "" when idle
    uint64_t pool_bytes = 0;
    memory::PoolStats pool;
    uint64_t swaps_in = 0;
    uint64_t swap_in_bytes = 0;
    double swap_in_seconds = 0;
    uint64_t evictions = 0;
    std::array<uint64_t, node::kEvictionReasons> evictions_by_reason{};  // by EvictionReason
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
    double rrc = 0;          // the highest of its instances'
    uint32_t instances = 0;  // connected instances (sessions)
  };
  std::vector<Gpu> gpus;
  std::vector<Function> functions;
  std::string placement, eviction, queue;
  uint64_t queued = 0;
  scheduler::SchedulerCounters counters;
  uint64_t preemptions = 0;  // background leases ended at their slice (NodeStatus::preemptions)
  uint64_t swap_group_bytes = 0;
  memory::HostPoolStats host_pool;
  bool draining = false;
  std::array<node::NodeStatus::LinkSwaps, node::kSwapLinks> swaps_by_link{};  // by SwapLink
  Histogram swap_seconds;
};

class Controller final : public GpuLessor, private node::Actuator {
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
  // The quota and memory settings of a new session of `function_id`, the instance keyed
  // `instance` ("" for none); an error refuses it (the function has as many instances as
  // --max_instances_per_function allows, another instance has that key, or it asks for more
  // than it may). A registered function's instance slot is taken for `session` until detach()
  // or withdraw().
  Result<SessionPlan> admit(const std::string& function_id, const std::string& instance,
                            uint64_t requested_quota, SessionId session);
  // An admitted session that never started (its creation or Welcome failed).
  void withdraw(const std::string& function_id, SessionId session);
  // The session exists (after Session::create, its memory owned by the plan's instance): it
  // may now be granted leases.
  void attach(LeaseHolder* session);
  // The session ended and released everything (its thread has run teardown). Returns once the
  // controller no longer refers to it, so the caller may destroy it.
  void detach(SessionId session);

  // ---- Control calls (any thread; replies come on the controller thread) ----
  void register_function(const Registration& registration, Reply<Ok> reply);
  void unregister_function(const std::string& function_id, Reply<Ok> reply);
  // A request of `function_id` for its instance keyed `instance`; "": the instance the node
  // core chooses (NodeCore::arrive).
  void request_arrived(const std::string& function_id, const std::string& instance,
                       Reply<uint64_t> reply);
  void request_start(uint64_t request, Reply<wire::Started> reply);
  // Both in one (the control call requestBegin): the reply carries the request's id. A request
  // whose start fails is ended here, since its caller has no id to end it with.
  void request_begin(const std::string& function_id, const std::string& instance,
                     Reply<wire::Started> reply);
  void request_done(uint64_t request, bool failed, Reply<Ok> reply);
  void drain(int gpu, bool resume, Reply<Ok> reply);
  void status(Reply<ControllerStatus> reply);

  // ---- GpuLessor (session threads, device callbacks) ----
  void need_gpu(SessionId session) override;
  void streaming(SessionId session, RequestId lease, const Status& status,
                 bool moves_nothing) override;
  void swap_done(SessionId session, RequestId lease, const Status& status,
                 const SwapReport& report) override;
  void released(SessionId session, RequestId lease, const Status& status) override;
  Status make_room(SessionId session, GpuId gpu, const memory::Shortfall& shortfall) override;
  void context_forgotten(SessionId session, GpuId gpu) override;

 private:
  struct State;
  using Event = std::function<void(State&)>;

  Controller(device::Device& device, const ControllerOptions& options);
  // False (and logged) once the controller has stopped.
  bool post(Event event);
  // Runs `fn` on the controller thread and waits for its result.
  template <typename T>
  T call(std::function<T(State&)> fn);
  void run();

  // The controller thread's handlers (state_ is theirs alone).
  // `id`: the session's function, registered or (when not) made for it now.
  void on_attach(LeaseHolder* session, FunctionId id, bool registered);
  void on_detach(SessionId session);
  void on_register(const Registration& registration, FunctionId id, Reply<Ok>& reply);
  void on_unregister(const std::string& function_id, Reply<Ok>& reply);
  void on_arrived(const std::string& function_id, const std::string& instance,
                  Reply<uint64_t>& reply);
  // Waits for request `id`'s start; `call` names the control call in errors.
  void on_start(RequestId id, Reply<wire::Started> reply, const char* call);
  void on_drain(int gpu, bool resume, Reply<Ok>& reply);
  ControllerStatus on_status();
  Result<device::Stream> service_stream(GpuId gpu);
  // Shared mode: `lease` ended with `fault`, which ended its GPU's shared context. Holds the
  // GPU and asks every session to forget its objects there; finish_reset() follows once all
  // have.
  void begin_reset(RequestId lease, const Status& fault);
  // Every session has forgotten its objects in `gpu`'s shared context: resets it, and the GPU
  // takes requests again (or, if the device refuses, is out of service).
  void finish_reset(GpuId gpu);
  // `session` has nothing more in any context being reset (it forgot, or it ended).
  void forgotten(SessionId session, std::optional<GpuId> gpu);

  // ---- node::Actuator (the controller thread) ----
  Result<uint64_t> evict(InstanceId instance, GpuId gpu) override;
  void forget(InstanceId instance, GpuId gpu) override;
  void start(const node::Start& start) override;
  void end(RequestId request, InstanceId instance, const Status& failure) override;
  void answer_start(RequestId request, const Result<node::StartInfo>& answer) override;
  void rejected(RequestId request, InstanceId instance, const Status& why) override;
  void drained(std::optional<GpuId> gpu) override;
  uint64_t pool_allocated(GpuId gpu) const override;
  uint64_t placed_bytes(InstanceId instance, GpuId gpu) const override;
  uint64_t model_bytes(InstanceId instance) const override;

  device::Device& device_;
  const ControllerOptions options_;
  std::unique_ptr<DevicePools> pools_;
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<scheduler::Topology> topology_;  // the core's
  uint64_t group_bytes_ = 0;

  // Registrations, readable from the daemon's thread for admit().
  struct Admitted {
    InstanceId instance;
    std::string key;  // its Hello's instance key; "" for none
  };
  struct Registered {
    Registration registration;
    FunctionId id;                            // the function in the node core
    std::map<SessionId, Admitted> instances;  // admitted and not yet detached or withdrawn
  };
  Mutex registry_mutex_;
  std::unordered_map<std::string, Registered> registry_ GUARDED_BY(registry_mutex_);
  uint32_t next_function_ GUARDED_BY(registry_mutex_) = 1;
  uint32_t next_instance_ GUARDED_BY(registry_mutex_) = 1;

  Mailbox<Event> events_;  // for the controller thread, in arrival order

  std::unique_ptr<State> state_;  // the controller thread's
  std::thread thread_;
};

}  // namespace hiber::server
