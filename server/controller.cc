#include "server/controller.h"

#include <algorithm>
#include <future>

#include <glog/logging.h>

#include "server/elbow.h"
#include "server/session.h"

namespace hiber::server {
namespace {

using scheduler::RequestId;
using Clock = std::chrono::steady_clock;

scheduler::Time now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A placeholder model size until the function's first lease shows it: the scheduler needs a
// positive size, and the memory layer asks for room itself when the real blocks do not fit.
constexpr uint64_t kUnknownModelBytes = 1;

}  // namespace

// ---- The controller thread's state ----

struct Controller::State {
  struct Tenant {
    std::string name;                  // the function id; ad-hoc sessions get "<id>#<session>"
    scheduler::FunctionId id{0};
    bool registered = false;
    Registration registration;
    Session* session = nullptr;
    uint64_t session_id = 0;
    std::shared_ptr<FunctionMemory> memory;
    bool had_first_request = false;
    std::optional<RequestId> implicit_queued;
    std::optional<RequestId> lease;  // granted and not yet released
    uint64_t model_bytes = kUnknownModelBytes;  // as the scheduler knows it
  };
  struct Request {
    scheduler::FunctionId function{0};
    bool implicit = false;
    scheduler::Time arrival = 0;
    bool granted = false;
    bool streaming = false;
    bool swap_pending = false;        // a swap was started and has not reported
    bool failed = false;              // the router said so, or its GPU failed
    bool done_requested = false;      // requestDone came; the lease is ending
    // Its lease ended before requestDone (its GPU failed, say): kept, so that requestStart and
    // requestDone still answer how it went, until requestDone or the function's exit.
    bool ended = false;
    bool release_source = false;
    bool drop_source_from_view = false;
    scheduler::Decision decision{.request = RequestId{0}, .function = scheduler::FunctionId{0}};
    std::optional<Reply<StartAnswer>> start_reply;
    Status start_error;
  };
  struct Executor {
    bool healthy = true;
    bool drained = false;
    std::optional<RequestId> running;
    std::optional<device::Stream> service;  // the controller's own work there (write-backs)
    uint64_t swaps_in = 0;
    uint64_t swap_in_bytes = 0;
    double swap_in_seconds = 0;
    uint64_t evictions = 0;
  };

  explicit State(scheduler::Topology t) : topology(std::move(t)) {}

  scheduler::Topology topology;
  std::unique_ptr<scheduler::Scheduler> scheduler;
  std::unordered_map<scheduler::FunctionId, Tenant> tenants;
  std::unordered_map<std::string, scheduler::FunctionId> by_name;
  std::unordered_map<uint64_t, scheduler::FunctionId> by_session;
  std::unordered_map<RequestId, Request> requests;
  std::vector<Executor> executors;
  uint32_t next_id = 1;
  bool draining = false;
  std::vector<Reply<Ok>> node_drains;
  std::vector<std::pair<int, Reply<Ok>>> gpu_drains;

  Tenant* tenant(scheduler::FunctionId id) {
    auto it = tenants.find(id);
    return it == tenants.end() ? nullptr : &it->second;
  }
  Tenant* tenant_of_session(uint64_t session) {
    auto it = by_session.find(session);
    return it == by_session.end() ? nullptr : tenant(it->second);
  }
};

// ---- Creation ----

Result<std::unique_ptr<Controller>> Controller::create(device::Device& device,
                                                       const ControllerOptions& options) {
  std::unique_ptr<Controller> controller(new Controller(device, options));
  HIBER_ASSIGN_OR_RETURN(scheduler::Topology topology,
                         scheduler::Topology::from_config(device.topology()));
  HIBER_ASSIGN_OR_RETURN(controller->repository_,
                         ModelRepository::create(device, options.repository));
  // The elbow is measured before the pools take the GPUs' memory.
  if (options.swap_group_bytes != 0) {
    controller->group_bytes_ = options.swap_group_bytes;
  } else {
    HIBER_ASSIGN_OR_RETURN(controller->group_bytes_,
                           find_elbow(device, *controller->repository_, options.elbow_cache));
  }
  HIBER_ASSIGN_OR_RETURN(controller->pools_, DevicePools::create(device, options.pools));

  auto state = std::make_unique<State>(std::move(topology));
  HIBER_ASSIGN_OR_RETURN(state->scheduler,
                         scheduler::Scheduler::create(state->topology, options.scheduler));
  state->executors.resize(device.gpu_count());
  controller->state_ = std::move(state);
  // The scheduler places models in the pool, not in the whole GPU.
  for (int g = 0; g < device.gpu_count(); ++g) {
    const uint64_t total = controller->state_->topology.memory_bytes(g);
    const uint64_t pool = controller->pools_->pool_bytes(g);
    controller->state_->scheduler->set_reserved(g, total > pool ? total - pool : 0);
  }
  LOG(INFO) << "controller: placement " << options.scheduler.placement << ", eviction "
            << options.scheduler.eviction << ", queue " << options.scheduler.queue << ", "
            << controller->pools_->kind_name() << " pools, swap groups of "
            << controller->group_bytes_ << " bytes, pipelining "
            << (options.pipelined ? "on" : "off") << ", host copies "
            << (options.repository.pinned ? "pinned" : "pageable");
  controller->thread_ = std::thread([c = controller.get()] { c->run(); });
  return controller;
}

Controller::Controller(device::Device& device, const ControllerOptions& options)
    : device_(device), options_(options) {}

Controller::~Controller() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (state_) {
    for (State::Executor& e : state_->executors) {
      if (e.service) (void)device_.destroy_stream(*e.service);
    }
    // Function memory (held by sessions) is gone before the pools it lived in.
    state_->tenants.clear();
  }
}

void Controller::post(Event event) {
  {
    std::lock_guard lock(queue_mutex_);
    events_.push_back(std::move(event));
  }
  queue_changed_.notify_one();
}

// ---- Plumbing ----

template <typename T>
T Controller::call(std::function<T(State&)> fn) {
  std::promise<T> promise;
  std::future<T> future = promise.get_future();
  post([&promise, &fn](State& state) { promise.set_value(fn(state)); });
  return future.get();
}

void Controller::run() {
  std::vector<Event> batch;
  while (true) {
    {
      std::unique_lock lock(queue_mutex_);
      const scheduler::Time wakeup = state_->scheduler->next_wakeup();
      auto ready = [this] { return stopping_ || !events_.empty(); };
      if (wakeup == scheduler::Scheduler::kNever) {
        queue_changed_.wait(lock, ready);
      } else {
        const auto delay = std::chrono::nanoseconds(std::max<int64_t>(0, wakeup - now_ns()));
        queue_changed_.wait_for(lock, delay, ready);
      }
      if (stopping_ && events_.empty()) return;
      batch.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
      events_.clear();
    }
    for (Event& event : batch) event(*state_);
    batch.clear();
    // Every event may have freed a GPU or queued a request.
    dispatch();
    check_drains();
  }
}

// ---- Sessions ----

Result<SessionPlan> Controller::admit(const std::string& function_id, uint64_t requested_quota,
                                      uint64_t session) {
  const uint64_t one_gpu = pools_->pool_bytes(0);
  const uint64_t max_quota = options_.max_quota_bytes != 0 ? options_.max_quota_bytes : one_gpu;
  SessionPlan plan;
  plan.memory.pipelined = options_.pipelined;
  plan.memory.group_bytes = group_bytes_;
  std::lock_guard lock(registry_mutex_);
  auto registered = registry_.find(function_id);
  uint64_t quota = requested_quota;
  if (registered != registry_.end()) {
    if (auto live = live_instances_.find(function_id); live != live_instances_.end()) {
      return error(ErrorCode::kDeviceUnavailable, "function '", function_id,
                   "' already has a connected instance (session ", live->second,
                   "); a registered function runs one instance per node");
    }
    plan.memory.stateful = registered->second.stateful;
    if (registered->second.quota_bytes != 0) quota = registered->second.quota_bytes;
  }
  if (quota == 0) quota = options_.default_quota_bytes != 0 ? options_.default_quota_bytes : one_gpu;
  if (quota > max_quota) {
    return error(ErrorCode::kOutOfMemory, "a quota of ", quota, " bytes is above the maximum of ",
                 max_quota);
  }
  if (registered != registry_.end()) live_instances_[function_id] = session;
  plan.quota_bytes = quota;
  return plan;
}

void Controller::withdraw(const std::string& function_id, uint64_t session) {
  std::lock_guard lock(registry_mutex_);
  auto live = live_instances_.find(function_id);
  if (live != live_instances_.end() && live->second == session) live_instances_.erase(live);
}

void Controller::attach(Session* session) {
  const std::string function_id = session->identity().function_id;
  bool registered = false;
  Registration registration;
  {
    std::lock_guard lock(registry_mutex_);
    if (auto it = registry_.find(function_id); it != registry_.end()) {
      registered = true;
      registration = it->second;
    }
  }
  post([this, session, function_id, registered, registration](State& s) {
    scheduler::FunctionId id{0};
    if (registered) {
      auto it = s.by_name.find(function_id);
      if (it == s.by_name.end()) {
        LOG(ERROR) << "session " << session->id() << ": function '" << function_id
                   << "' is registered but unknown to the scheduler";
        return;
      }
      id = it->second;
    } else {
      // A process that connected on its own: a tenant of its own, with the default SLO.
      id = scheduler::FunctionId{s.next_id++};
      scheduler::FunctionSpec spec;
      spec.name = str_cat(function_id, "#", session->id());
      spec.model_bytes = kUnknownModelBytes;
      spec.slo = options_.default_slo;
      Status added = s.scheduler->register_function(id, spec, now_ns());
      if (!added.ok()) {
        LOG(ERROR) << "session " << session->id() << ": " << added;
        return;
      }
      State::Tenant tenant;
      tenant.name = spec.name;
      tenant.id = id;
      s.tenants.emplace(id, std::move(tenant));
      s.by_name.emplace(spec.name, id);
    }
    State::Tenant& t = s.tenants.at(id);
    t.session = session;
    t.session_id = session->id();
    t.memory = session->memory();
    t.had_first_request = false;
    t.model_bytes = kUnknownModelBytes;
    s.by_session.insert_or_assign(session->id(), id);
  });
}

void Controller::detach(uint64_t session) {
  call<bool>([this, session](State&) {
    on_detach(session);
    return true;
  });
}

void Controller::on_detach(uint64_t session) {
  State& s = *state_;
  State::Tenant* t = s.tenant_of_session(session);
  if (t == nullptr) return;
  const scheduler::Time now = now_ns();
  // Its requests end: queued ones are withdrawn, the running one failed (the session's teardown
  // drained its work, so the GPU is free).
  std::vector<RequestId> mine;
  for (const auto& [id, r] : s.requests) {
    if (r.function == t->id) mine.push_back(id);
  }
  for (RequestId id : mine) {
    State::Request& r = s.requests.at(id);
    if (r.start_reply) {
      r.start_error = error(ErrorCode::kDeinitialized, "the instance of '", t->name,
                            "' exited before its request started");
      answer_start(id.value());
    }
    if (r.ended) {
      forget_request(id.value());
      continue;
    }
    if (r.swap_pending) (void)s.scheduler->load_done(id, now, false);
    if (r.granted) {
      (void)s.scheduler->done(id, now, scheduler::Completion{.failed = true});
      s.executors[r.decision.gpu].running = std::nullopt;
    } else {
      (void)s.scheduler->cancel(id, now);
    }
    forget_request(id.value());
  }
  // Its memory went with the session.
  for (int g = 0; g < static_cast<int>(s.executors.size()); ++g) {
    s.scheduler->drop_replica(g, t->id);
  }
  t->session = nullptr;
  t->memory.reset();
  t->lease = t->implicit_queued = std::nullopt;
  s.by_session.erase(session);
  if (!t->registered) {
    std::vector<RequestId> cancelled;
    Status gone = s.scheduler->unregister_function(t->id, now, &cancelled);
    LOG_IF(ERROR, !gone.ok()) << "forgetting '" << t->name << "': " << gone;
    s.by_name.erase(t->name);
    s.tenants.erase(t->id);
  } else {
    std::lock_guard lock(registry_mutex_);
    auto live = live_instances_.find(t->name);
    if (live != live_instances_.end() && live->second == session) live_instances_.erase(live);
  }
  for (int g = 0; g < static_cast<int>(s.executors.size()); ++g) update_reserved(g);
}

// ---- Control calls ----

void Controller::register_function(const Registration& registration, Reply<Ok> reply) {
  Registration r = registration;
  if (r.tail_percentile == 0) r.tail_percentile = 0.98;
  if (r.function_id.empty() || r.function_id.find('#') != std::string::npos) {
    reply(error(ErrorCode::kInvalidValue, "registerFunction: a function id must be non-empty "
                                          "and must not contain '#'"));
    return;
  }
  if (!(r.slo > 0) || !(r.tail_percentile > 0 && r.tail_percentile < 1)) {
    reply(error(ErrorCode::kInvalidValue, "registerFunction '", r.function_id, "': the SLO must be > 0 "
                "and the tail percentile in (0, 1)"));
    return;
  }
  const uint64_t max_quota =
      options_.max_quota_bytes != 0 ? options_.max_quota_bytes : pools_->pool_bytes(0);
  if (r.quota_bytes > max_quota) {
    reply(error(ErrorCode::kOutOfMemory, "registerFunction '", r.function_id, "': a quota of ",
                r.quota_bytes, " bytes is above the maximum of ", max_quota));
    return;
  }
  {
    std::lock_guard lock(registry_mutex_);
    if (registry_.count(r.function_id) != 0) {
      reply(error(ErrorCode::kInvalidValue, "function '", r.function_id, "' is already registered"));
      return;
    }
    registry_.emplace(r.function_id, r);
  }
  post([this, r, reply = std::move(reply)](State& s) {
    const scheduler::FunctionId id = scheduler::FunctionId{s.next_id++};
    scheduler::FunctionSpec spec;
    spec.name = r.function_id;
    spec.model_bytes = kUnknownModelBytes;
    spec.slo = r.slo;
    spec.tail_percentile = r.tail_percentile;
    spec.heavy_hint = r.heavy_hint;
    spec.exec_time_hint = r.exec_hint;
    Status added = s.scheduler->register_function(id, spec, now_ns());
    if (!added.ok()) {
      std::lock_guard lock(registry_mutex_);
      registry_.erase(r.function_id);
      reply(added);
      return;
    }
    State::Tenant tenant;
    tenant.name = r.function_id;
    tenant.id = id;
    tenant.registered = true;
    tenant.registration = r;
    s.tenants.emplace(id, std::move(tenant));
    s.by_name.emplace(r.function_id, id);
    LOG(INFO) << "registered function '" << r.function_id << "': SLO " << r.slo / 1e6 << " ms at p"
              << r.tail_percentile * 100 << (r.stateful ? ", stateful" : "");
    reply(Ok{});
  });
}

void Controller::unregister_function(const std::string& function_id, Reply<Ok> reply) {
  post([this, function_id, reply = std::move(reply)](State& s) {
    auto it = s.by_name.find(function_id);
    State::Tenant* t = it == s.by_name.end() ? nullptr : s.tenant(it->second);
    if (t == nullptr || !t->registered) {
      reply(error(ErrorCode::kNotFound, "function '", function_id, "' is not registered"));
      return;
    }
    if (t->session != nullptr) {
      reply(error(ErrorCode::kIllegalState, "function '", function_id,
                  "' still has a connected instance (session ", t->session_id,
                  "); stop it first"));
      return;
    }
    std::vector<RequestId> cancelled;
    Status gone = s.scheduler->unregister_function(t->id, now_ns(), &cancelled);
    if (!gone.ok()) {
      reply(gone);
      return;
    }
    for (RequestId id : cancelled) forget_request(id.value());
    s.by_name.erase(function_id);
    s.tenants.erase(t->id);
    {
      std::lock_guard lock(registry_mutex_);
      registry_.erase(function_id);
    }
    reply(Ok{});
  });
}

void Controller::request_arrived(const std::string& function_id, Reply<uint64_t> reply) {
  post([this, function_id, reply = std::move(reply)](State&) mutable { on_arrived(function_id, reply); });
}

void Controller::on_arrived(const std::string& function_id, Reply<uint64_t>& reply) {
  State& s = *state_;
  auto it = s.by_name.find(function_id);
  State::Tenant* t = it == s.by_name.end() ? nullptr : s.tenant(it->second);
  if (t == nullptr || !t->registered) {
    reply(error(ErrorCode::kNotFound, "requestArrived: function '", function_id,
                "' is not registered"));
    return;
  }
  if (s.draining) {
    reply(error(ErrorCode::kDeviceUnavailable, "requestArrived: the node is draining"));
    return;
  }
  if (t->session == nullptr) {
    reply(error(ErrorCode::kDeviceUnavailable, "requestArrived: function '", function_id,
                "' has no connected instance"));
    return;
  }
  const scheduler::Time now = now_ns();
  auto id = s.scheduler->arrive(t->id, now);
  if (!id.ok()) {
    reply(id.status());
    return;
  }
  State::Request r;
  r.function = t->id;
  r.arrival = now;
  s.requests.emplace(*id, std::move(r));
  reply(id->value());
}

void Controller::request_start(uint64_t request, Reply<StartAnswer> reply) {
  post([this, request, reply = std::move(reply)](State& s) {
    auto it = s.requests.find(RequestId{request});
    if (it == s.requests.end() || it->second.implicit) {
      reply(error(ErrorCode::kNotFound, "requestStart: no request ", request,
                  " is waiting (unknown, finished or withdrawn)"));
      return;
    }
    if (it->second.start_reply) {
      reply(error(ErrorCode::kInvalidValue, "requestStart: request ", request,
                  " is already being waited for"));
      return;
    }
    it->second.start_reply = std::move(reply);
    if (it->second.streaming || !it->second.start_error.ok()) answer_start(request);
  });
}

void Controller::request_done(uint64_t request, bool failed, Reply<Ok> reply) {
  post([this, request, failed, reply = std::move(reply)](State& s) {
    auto it = s.requests.find(RequestId{request});
    if (it == s.requests.end() || it->second.implicit || it->second.done_requested) {
      reply(error(ErrorCode::kNotFound, "requestDone: no request ", request,
                  " is running (unknown or finished)"));
      return;
    }
    State::Request& r = it->second;
    r.done_requested = true;
    r.failed |= failed;
    if (r.ended) {  // its lease ended already; now the router knows
      forget_request(request);
      reply(Ok{});
      return;
    }
    if (!r.granted) {
      // Never started: it leaves the queue.
      (void)s.scheduler->cancel(RequestId{request}, now_ns());
      if (r.start_reply) {
        r.start_error = error(ErrorCode::kDeinitialized, "request ", request, " was marked done");
        answer_start(request);
      }
      forget_request(request);
      reply(Ok{});
      return;
    }
    // The GPU is given back once the function's work there has drained (on_released).
    State::Tenant* t = s.tenant(r.function);
    if (t != nullptr && t->session != nullptr) t->session->end_lease(request);
    reply(Ok{});
  });
}

void Controller::drain(int gpu, bool resume, Reply<Ok> reply) {
  post([this, gpu, resume, reply = std::move(reply)](State&) mutable { on_drain(gpu, resume, reply); });
}

void Controller::on_drain(int gpu, bool resume, Reply<Ok>& reply) {
  State& s = *state_;
  if (gpu < -1 || gpu >= static_cast<int>(s.executors.size())) {
    reply(error(ErrorCode::kInvalidDevice, "drain: no GPU ", gpu));
    return;
  }
  if (gpu < 0) {
    s.draining = !resume;
    if (resume) {
      reply(Ok{});
    } else {
      s.node_drains.push_back(std::move(reply));
    }
    return;
  }
  State::Executor& e = s.executors[gpu];
  if (resume) {
    e.drained = false;
    if (e.healthy) s.scheduler->set_gpu_healthy(gpu, true);
    reply(Ok{});
    return;
  }
  e.drained = true;
  s.scheduler->set_gpu_healthy(gpu, false);
  // Its models leave (the scheduler's view already forgot them); the running one leaves when
  // its request is done.
  for (auto& [id, t] : s.tenants) {
    const bool runs_here = e.running.has_value() && t.lease == e.running;
    if (t.memory && !runs_here) evict(id, gpu);
  }
  s.gpu_drains.emplace_back(gpu, std::move(reply));
}

void Controller::status(Reply<ControllerStatus> reply) {
  post([this, reply = std::move(reply)](State&) { reply(on_status()); });
}

ControllerStatus Controller::on_status() {
  State& s = *state_;
  ControllerStatus out;
  const scheduler::Time now = now_ns();
  for (int g = 0; g < static_cast<int>(s.executors.size()); ++g) {
    const State::Executor& e = s.executors[g];
    ControllerStatus::Gpu gpu;
    gpu.healthy = e.healthy;
    gpu.drained = e.drained;
    if (e.running.has_value()) {
      if (State::Tenant* t = s.tenant(s.requests.at(*e.running).function)) gpu.running = t->name;
    }
    gpu.pool_bytes = pools_->pool_bytes(g);
    gpu.pool = pools_->pools().stats(g);
    gpu.swaps_in = e.swaps_in;
    gpu.swap_in_bytes = e.swap_in_bytes;
    gpu.swap_in_seconds = e.swap_in_seconds;
    gpu.evictions = e.evictions;
    out.gpus.push_back(gpu);
  }
  const scheduler::FunctionTable& table = s.scheduler->functions();
  for (const auto& [id, t] : s.tenants) {
    ControllerStatus::Function f;
    f.function_id = t.name;
    f.registered = t.registered;
    f.stateful = t.registration.stateful;
    f.model_bytes = t.memory ? t.memory->model_bytes() : 0;
    if (const std::optional<scheduler::FunctionIndex> found = table.find(id)) {
      const scheduler::FunctionIndex index = *found;
      f.heavy = table.heavy(index);
      f.requests = table.stats(index).requests;
      const scheduler::WindowTotals w = table.stats(index).window.totals(now);
      f.on_time = w.on_time;
      f.rrc = s.scheduler->rrc(id, now);
      const scheduler::GpuMask holders = s.scheduler->node().holders(index);
      for (int g = 0; g < static_cast<int>(s.executors.size()); ++g) {
        if (holders & scheduler::gpu_bit(g)) f.resident_gpus.push_back(g);
      }
    }
    out.functions.push_back(std::move(f));
  }
  std::sort(out.functions.begin(), out.functions.end(),
            [](const auto& a, const auto& b) { return a.function_id < b.function_id; });
  out.placement = options_.scheduler.placement;
  out.eviction = options_.scheduler.eviction;
  out.queue = options_.scheduler.queue;
  out.queued = s.scheduler->queued();
  out.counters = s.scheduler->counters();
  out.swap_group_bytes = group_bytes_;
  out.host_pool = repository_->stats();
  out.draining = s.draining;
  return out;
}

// ---- Leases ----

void Controller::need_gpu(uint64_t session) {
  post([this, session](State&) { on_need_gpu(session); });
}

void Controller::on_need_gpu(uint64_t session) {
  State& s = *state_;
  State::Tenant* t = s.tenant_of_session(session);
  if (t == nullptr) return;
  // A lease is on its way (or held: the session asked before it saw the grant).
  if (t->lease.has_value() || t->implicit_queued.has_value()) return;
  // Queued router requests of the function will give it a lease; its calls run under that.
  for (const auto& [id, r] : s.requests) {
    if (r.function == t->id && !r.implicit && !r.ended) return;
  }
  // Background: the function's own use of a GPU is not one of its callers' requests, and must
  // not weigh on its SLO statistics (RRC) or its execution times.
  auto id = s.scheduler->arrive(t->id, now_ns(), /*background=*/true);
  if (!id.ok()) {
    LOG(ERROR) << "session " << session << ": cannot queue an implicit request: " << id.status();
    return;
  }
  State::Request r;
  r.function = t->id;
  r.implicit = true;
  r.arrival = now_ns();
  s.requests.emplace(*id, std::move(r));
  t->implicit_queued = *id;
}

void Controller::streaming(uint64_t session, uint64_t lease, const Status& status) {
  post([this, session, lease, status](State&) { on_streaming(session, lease, status); });
}

void Controller::on_streaming(uint64_t, uint64_t lease, const Status& status) {
  State& s = *state_;
  auto it = s.requests.find(RequestId{lease});
  if (it == s.requests.end()) return;
  State::Request& r = it->second;
  if (status.ok()) {
    r.streaming = true;
  } else {
    r.start_error = status;
    r.failed = true;
  }
  answer_start(lease);
}

void Controller::answer_start(uint64_t request) {
  State& s = *state_;
  State::Request& r = s.requests.at(RequestId{request});
  if (!r.start_reply) return;
  Reply<StartAnswer> reply = std::move(*r.start_reply);
  r.start_reply.reset();
  if (!r.start_error.ok()) {
    reply(r.start_error);
    return;
  }
  StartAnswer answer;
  answer.gpu = r.decision.gpu;
  answer.source = r.decision.source;
  answer.source_gpu = r.decision.source_gpu;
  answer.rule = r.decision.rule;
  answer.queued_ms = static_cast<double>(now_ns() - r.arrival) / 1e6;
  reply(answer);
}

void Controller::swap_done(uint64_t session, uint64_t lease, const Status& status,
                           const SwapReport& report) {
  post([this, session, lease, status, report](State&) { on_swap_done(session, lease, status, report); });
}

void Controller::on_swap_done(uint64_t, uint64_t lease, const Status& status,
                              const SwapReport& report) {
  State& s = *state_;
  auto it = s.requests.find(RequestId{lease});
  if (it == s.requests.end()) return;
  State::Request& r = it->second;
  if (!r.swap_pending) return;
  r.swap_pending = false;
  const int gpu = r.decision.gpu;
  const scheduler::Time now = now_ns();
  (void)s.scheduler->load_done(RequestId{lease}, now, status.ok());
  State::Tenant* t = s.tenant(r.function);
  if (t != nullptr && t->memory) t->memory->retire_windows();
  State::Executor& e = s.executors[gpu];
  if (!status.ok()) {
    r.failed = true;
    fail_gpu(gpu, status.with_context("swapping a model in"));
    return;
  }
  ++e.swaps_in;
  e.swap_in_bytes += report.bytes;
  e.swap_in_seconds += static_cast<double>(report.duration_ns) / 1e9;
  if (r.decision.source == scheduler::Source::kPeer && r.release_source && t != nullptr &&
      t->memory) {
    // The copy was a move: the old replica goes (the scheduler may not have dropped it itself:
    // a function whose every block is state keeps one replica, full or not).
    if (r.drop_source_from_view) s.scheduler->drop_replica(r.decision.source_gpu, t->id);
    t->memory->forget(r.decision.source_gpu);
    update_reserved(r.decision.source_gpu);
  }
}

void Controller::released(uint64_t session, uint64_t lease, const Status& status) {
  post([this, session, lease, status](State&) { on_released(session, lease, status); });
}

void Controller::on_released(uint64_t, uint64_t lease, const Status& status) {
  State& s = *state_;
  auto it = s.requests.find(RequestId{lease});
  if (it == s.requests.end() || it->second.ended) return;
  State::Request& r = it->second;
  const scheduler::Time now = now_ns();
  const int gpu = r.decision.gpu;
  State::Tenant* t = s.tenant(r.function);
  if (r.swap_pending) {
    r.swap_pending = false;
    (void)s.scheduler->load_done(RequestId{lease}, now, false);
  }
  if (r.start_error.ok() && !r.streaming) {
    r.start_error = status.ok() ? error(ErrorCode::kUnknown, "the lease ended before it started")
                                : status;
  }
  answer_start(lease);
  scheduler::Completion completion;
  completion.failed = r.failed || !status.ok();
  (void)s.scheduler->done(RequestId{lease}, now, completion);
  if (gpu >= 0) s.executors[gpu].running = std::nullopt;
  if (t != nullptr) {
    if (t->lease == RequestId{lease}) t->lease = std::nullopt;
    if (t->memory) {
      // The scheduler learns the model's real size once a lease has shown it.
      const uint64_t model = std::max<uint64_t>(t->memory->model_bytes(), kUnknownModelBytes);
      if (model != t->model_bytes) {
        t->model_bytes = model;
        (void)s.scheduler->set_model_bytes(t->id, model);
      }
      if (gpu >= 0 && (!s.executors[gpu].healthy || s.executors[gpu].drained)) {
        s.scheduler->drop_replica(gpu, t->id);
        if (s.executors[gpu].healthy) {
          evict(t->id, gpu);
        } else {
          t->memory->forget(gpu);
        }
      }
    }
  }
  if (r.implicit || r.done_requested) {
    forget_request(lease);
  } else {
    r.ended = true;
  }
  if (gpu >= 0) update_reserved(gpu);
}

Status Controller::make_room(uint64_t session, int gpu, const memory::Shortfall& shortfall) {
  return call<Status>(
      [this, session, gpu, &shortfall](State&) { return on_make_room(session, gpu, shortfall); });
}

Status Controller::on_make_room(uint64_t session, int gpu, const memory::Shortfall& shortfall) {
  State& s = *state_;
  State::Tenant* t = s.tenant_of_session(session);
  if (t == nullptr || gpu < 0 || gpu >= static_cast<int>(s.executors.size())) {
    return error(ErrorCode::kOutOfMemory, "no room on GPU ", gpu);
  }
  update_reserved(gpu);
  // Bytes short: the eviction policy chooses.
  std::vector<scheduler::Eviction> victims;
  if (!s.scheduler->make_room(gpu, shortfall.needed_bytes, t->id, now_ns(), &victims)) {
    return error(ErrorCode::kOutOfMemory, "GPU ", gpu, " has no room for ", shortfall.needed_bytes,
                 " more bytes: everything there is in use or protected");
  }
  for (const scheduler::Eviction& v : victims) evict(v.function, v.gpu);
  if (victims.empty()) {
    // The bytes are there but in pieces: the pool names the owners of the region that, freed,
    // holds the block. Functions running there, or whose replica is being copied, stay.
    bool evicted = false;
    for (const memory::OwnerBytes& owner : shortfall.evict) {
      State::Tenant* victim = s.tenant_of_session(owner.function.value());
      if (victim == nullptr || victim == t) continue;
      const std::optional<RequestId> running = s.executors[gpu].running;
      if (running.has_value() && victim->lease == running) continue;
      const std::optional<scheduler::FunctionIndex> index =
          s.scheduler->functions().find(victim->id);
      if (const scheduler::Replica* r = index ? s.scheduler->node().find(gpu, *index) : nullptr;
          r != nullptr && (r->loading || r->source_pins > 0)) {
        continue;
      }
      s.scheduler->drop_replica(gpu, victim->id);
      evict(victim->id, gpu);
      evicted = true;
    }
    if (!evicted) {
      return error(ErrorCode::kOutOfMemory, "GPU ", gpu, ": ", shortfall.describe(),
                   "; none of it may be evicted now");
    }
  }
  update_reserved(gpu);
  return Status();
}

// ---- Decisions ----

void Controller::dispatch() {
  State& s = *state_;
  std::vector<scheduler::Decision> decisions;
  s.scheduler->dispatch(now_ns(), &decisions);
  for (scheduler::Decision& d : decisions) {
    State::Request& r = s.requests.at(d.request);
    State::Tenant* t = s.tenant(r.function);
    s.executors[d.gpu].running = d.request;
    for (const scheduler::Eviction& v : d.evictions) evict(v.function, v.gpu);
    r.decision = d;
    r.granted = true;
    if (t == nullptr || t->session == nullptr) {
      // The instance went away after the request queued.
      r.start_error = error(ErrorCode::kDeinitialized, "the function's instance is gone");
      answer_start(d.request.value());
      (void)s.scheduler->cancel(d.request, now_ns());
      s.executors[d.gpu].running = std::nullopt;
      forget_request(d.request.value());
      continue;
    }
    Lease lease;
    lease.id = d.request.value();
    lease.gpu = d.gpu;
    lease.implicit = r.implicit;
    lease.source = d.source;
    lease.source_gpu = d.source_gpu;
    lease.first_request = !r.implicit && !t->had_first_request;
    if (!r.implicit) t->had_first_request = true;
    // A function whose every block is state keeps a single replica: copies of it are moves.
    const bool all_state = t->registration.stateful || !t->memory->model_fixed();
    r.release_source = d.source == scheduler::Source::kPeer && (d.release_source || all_state);
    r.drop_source_from_view = r.release_source && !d.release_source;
    lease.release_source = r.release_source;
    r.swap_pending = d.source != scheduler::Source::kResident;
    t->lease = d.request;
    if (r.implicit) {
      t->implicit_queued = std::nullopt;
    } else if (t->implicit_queued.has_value()) {
      // The session's calls run under this lease; the implicit request it asked for is moot.
      (void)s.scheduler->cancel(*t->implicit_queued, now_ns());
      forget_request(t->implicit_queued->value());
      t->implicit_queued = std::nullopt;
    }
    t->session->grant(lease);
  }
}

void Controller::evict(scheduler::FunctionId function, int gpu) {
  State& s = *state_;
  State::Tenant* t = s.tenant(function);
  if (t == nullptr || !t->memory) return;
  auto stream = service_stream(gpu);
  Result<uint64_t> freed = stream.ok() ? t->memory->evict(gpu, *stream) : stream.status();
  if (!freed.ok()) {
    LOG(ERROR) << "evicting '" << t->name << "' from GPU " << gpu << ": " << freed.status();
    // A copy that failed is the GPU's fault; anything else is ours, and the GPU is fine.
    if (freed.status().code() != ErrorCode::kIllegalState) {
      fail_gpu(gpu, freed.status().with_context("writing a model back"));
    }
    return;
  }
  if (*freed > 0) ++s.executors[gpu].evictions;
  update_reserved(gpu);
}

void Controller::update_reserved(int gpu) {
  State& s = *state_;
  const uint64_t total = s.topology.memory_bytes(gpu);
  const uint64_t pool = pools_->pool_bytes(gpu);
  const uint64_t allocated = pools_->pools().stats(gpu).allocated_bytes;
  const uint64_t models = s.scheduler->node().gpu(gpu).used;
  const uint64_t outside_pool = total > pool ? total - pool : 0;
  s.scheduler->set_reserved(gpu, outside_pool + (allocated > models ? allocated - models : 0));
}

void Controller::fail_gpu(int gpu, const Status& why) {
  State& s = *state_;
  State::Executor& e = s.executors[gpu];
  if (!e.healthy) return;
  LOG(ERROR) << "GPU " << gpu << " failed (" << why << "): it takes no more requests; its "
             << "models will be brought back from their host copies elsewhere";
  e.healthy = false;
  s.scheduler->set_gpu_healthy(gpu, false);
  for (auto& [id, t] : s.tenants) {
    const bool runs_here = e.running.has_value() && t.lease == e.running;
    if (t.memory && !runs_here) t.memory->forget(gpu);
  }
  if (e.running.has_value()) {
    State::Request& r = s.requests.at(*e.running);
    r.failed = true;
    State::Tenant* t = s.tenant(r.function);
    if (t != nullptr && t->session != nullptr) t->session->fail(e.running->value(), why);
  }
}

void Controller::forget_request(uint64_t request) { state_->requests.erase(RequestId{request}); }

void Controller::check_drains() {
  State& s = *state_;
  if (!s.node_drains.empty()) {
    bool busy = false;
    for (const auto& [id, r] : s.requests) busy |= !r.implicit && !r.ended;
    if (!busy) {
      for (Reply<Ok>& reply : s.node_drains) reply(Ok{});
      s.node_drains.clear();
    }
  }
  for (auto it = s.gpu_drains.begin(); it != s.gpu_drains.end();) {
    if (!s.executors[it->first].running.has_value()) {
      it->second(Ok{});
      it = s.gpu_drains.erase(it);
    } else {
      ++it;
    }
  }
}

Result<device::Stream> Controller::service_stream(int gpu) {
  State::Executor& e = state_->executors[gpu];
  if (!e.service) {
    HIBER_ASSIGN_OR_RETURN(device::Stream stream, device_.create_stream(gpu, 0));
    e.service = stream;
  }
  return *e.service;
}

}  // namespace hiber::server
