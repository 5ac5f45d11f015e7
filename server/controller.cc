#include "server/controller.h"

#include <algorithm>
#include <future>
#include <set>

#include <glog/logging.h>

#include "server/elbow.h"

namespace hiber::server {
namespace {

using Clock = std::chrono::steady_clock;

scheduler::Time now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A placeholder model size until the function's first lease shows it: the scheduler needs a
// positive size, and the memory layer asks for room itself when the real blocks do not fit.
constexpr uint64_t kUnknownModelBytes = 1;

// What the node core is told of a registered function (of each of its instances).
node::FunctionSpec function_spec(const Registration& r) {
  node::FunctionSpec spec;
  spec.name = r.function_id;
  spec.model_bytes = kUnknownModelBytes;
  spec.slo = r.slo;
  spec.tail_percentile = r.tail_percentile;
  spec.heavy_hint = r.heavy_hint;
  spec.exec_time_hint = r.exec_hint;
  spec.stateful = r.stateful;
  return spec;
}

}  // namespace

// ---- The controller thread's state ----

struct Controller::State {
  // A function the node knows: registered by the router, or a program that connected on its own
  // (a function of its own, "<id>#<session>", forgotten when it disconnects).
  struct Function {
    std::string name;
    bool registered = false;
    Registration registration;
    std::vector<InstanceId> instances;  // connected, in the order they attached
  };
  // A connected session: one instance of a function (node/node_core.h, "Functions and
  // instances").
  struct Instance {
    FunctionId function;
    LeaseHolder* session = nullptr;
    SessionId session_id;
    std::string key;  // its Hello's instance key
    std::shared_ptr<FunctionMemory> memory;
  };

  std::unique_ptr<node::NodeCore> core;
  std::unordered_map<FunctionId, Function> functions;
  std::unordered_map<std::string, FunctionId> by_name;  // registrations and ad-hoc functions
  std::unordered_map<InstanceId, Instance> instances;
  std::unordered_map<SessionId, InstanceId> by_session;
  std::unordered_map<RequestId, Reply<wire::Started>> start_replies;
  std::deque<std::pair<std::optional<GpuId>, Reply<Ok>>> drain_replies;  // in the order asked
  std::vector<std::optional<device::Stream>> service;  // per GPU: the controller's write-backs
  // Shared mode: GPUs whose shared context is being reset after a fault, with the fault and
  // the sessions that have not yet forgotten their objects there.
  struct Reset {
    Status fault;
    std::set<SessionId> waiting;
  };
  std::map<GpuId, Reset> resets;

  Function* function(FunctionId id) {
    auto it = functions.find(id);
    return it == functions.end() ? nullptr : &it->second;
  }
  Function* function_named(const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : function(it->second);
  }
  Instance* instance(InstanceId id) {
    auto it = instances.find(id);
    return it == instances.end() ? nullptr : &it->second;
  }
  const Instance* instance(InstanceId id) const {
    auto it = instances.find(id);
    return it == instances.end() ? nullptr : &it->second;
  }
  Instance* instance_of_session(SessionId session) {
    auto it = by_session.find(session);
    return it == by_session.end() ? nullptr : instance(it->second);
  }
};

// ---- Creation ----

Result<std::unique_ptr<Controller>> Controller::create(device::Device& device,
                                                       const ControllerOptions& options) {
  // The node core could run two functions on one GPU (SchedulerOptions::sharing), but a lease is
  // what keeps functions apart here: their memory is made accessible from the leased GPU, not
  // to the leased function, in the GPU's one context that every session shares.
  if (options.scheduler.sharing != "off") {
    return error(ErrorCode::kInvalidValue, "sharing '", options.scheduler.sharing,
                 "' is refused: hiberd leases a GPU to one function at a time because that is "
                 "what isolates functions from each other (a lease maps the function's memory "
                 "accessible from the GPU, in the context all functions share), so two "
                 "functions on one GPU could reach each other's memory; sharing a GPU needs a "
                 "context per function (docs/hiberd.md, \"Spatial sharing\")");
  }
  // A prewarm is a GPU lease that loads a model for no session: the controller swaps models in
  // only for a session's lease (its blocks are mapped at the function's own addresses), so it
  // has nobody to load one for.
  if (options.scheduler.prewarm != scheduler::PrewarmRule::kNone)
    return error(ErrorCode::kInvalidValue,
                 "prewarming is for hiber-sim only: hiberd loads a model only into a function "
                 "session's lease, and a prewarm has no session");
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

  controller->topology_ = std::make_unique<scheduler::Topology>(std::move(topology));
  // The scheduler places models in the pool, not in the whole GPU.
  node::NodeOptions core_options;
  core_options.scheduler = options.scheduler;
  core_options.lease_slice = options.lease_slice;
  for (int g = 0; g < device.gpu_count(); ++g) {
    const uint64_t total = controller->topology_->memory_bytes(g);
    const uint64_t pool = controller->pools_->pool_bytes(g);
    core_options.outside_pool_bytes.push_back(total > pool ? total - pool : 0);
  }
  auto state = std::make_unique<State>();
  state->service.resize(device.gpu_count());
  HIBER_ASSIGN_OR_RETURN(state->core,
                         node::NodeCore::create(*controller->topology_, core_options, *controller));
  controller->state_ = std::move(state);
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
  events_.close();
  if (thread_.joinable()) thread_.join();
  if (state_) {
    for (const std::optional<device::Stream>& stream : state_->service) {
      if (stream) (void)device_.destroy_stream(*stream);
    }
    // Function memory (held by sessions) is gone before the pools it lived in.
    state_->instances.clear();
  }
}

bool Controller::post(Event event) {
  if (events_.post(std::move(event))) return true;
  // Sessions and control connections end before the controller does.
  LOG(DFATAL) << "an event for the controller after it stopped";
  return false;
}

// ---- Plumbing ----

template <typename T>
T Controller::call(std::function<T(State&)> fn) {
  std::promise<T> promise;
  std::future<T> future = promise.get_future();
  if (!post([&promise, &fn](State& state) { promise.set_value(fn(state)); })) return T{};
  return future.get();
}

void Controller::run() {
  while (true) {
    const scheduler::Time wakeup = state_->core->next_wakeup();
    // Without a wakeup the thread sleeps until an event comes; the hour only bounds the wait.
    const std::chrono::nanoseconds delay =
        wakeup == scheduler::Scheduler::kNever
            ? std::chrono::nanoseconds(std::chrono::hours(1))
            : std::chrono::nanoseconds(std::max<int64_t>(0, wakeup - now_ns()));
    events_.wait_for(delay);
    std::vector<Event> batch = events_.take_all();
    if (batch.empty() && events_.closed()) return;
    for (Event& event : batch) event(*state_);
    // Every event may have freed a GPU or queued a request.
    state_->core->dispatch(now_ns());
  }
}

// ---- Sessions ----

Result<SessionPlan> Controller::admit(const std::string& function_id, const std::string& instance,
                                      uint64_t requested_quota, SessionId session) {
  const uint64_t one_gpu = pools_->pool_bytes(0);
  const uint64_t max_quota = options_.max_quota_bytes != 0 ? options_.max_quota_bytes : one_gpu;
  SessionPlan plan;
  plan.memory.pipelined = options_.pipelined;
  plan.memory.group_bytes = group_bytes_;
  MutexLock lock(registry_mutex_);
  auto registered = registry_.find(function_id);
  uint64_t quota = requested_quota;
  if (registered != registry_.end()) {
    const auto& instances = registered->second.instances;
    if (options_.max_instances_per_function != 0 &&
        instances.size() >= options_.max_instances_per_function) {
      return error(ErrorCode::kDeviceUnavailable, "function '", function_id, "' already has ",
                   instances.size(),
                   " connected instances, the most --max_instances_per_function allows");
    }
    if (!instance.empty()) {
      for (const auto& [other, admitted] : instances) {
        if (admitted.key == instance) {
          return error(ErrorCode::kInvalidValue, "function '", function_id, "' has an instance '",
                       instance, "' connected already (session ", other,
                       "); each instance needs a key of its own");
        }
      }
    }
    const Registration& r = registered->second.registration;
    plan.memory.stateful = r.stateful;
    if (options_.kernel_deadline > 0) {
      plan.kernel_deadline = std::chrono::nanoseconds(std::max(options_.kernel_deadline, r.slo));
    }
    if (r.quota_bytes != 0) quota = r.quota_bytes;
  }
  if (quota == 0)
    quota = options_.default_quota_bytes != 0 ? options_.default_quota_bytes : one_gpu;
  if (quota > max_quota) {
    return error(ErrorCode::kOutOfMemory, "a quota of ", quota, " bytes is above the maximum of ",
                 max_quota);
  }
  if (next_instance_ == UINT32_MAX) {
    return error(ErrorCode::kDeviceUnavailable, "hiberd has numbered ", next_instance_,
                 " instances, all it can; restart it");
  }
  plan.instance = InstanceId{next_instance_++};
  if (registered != registry_.end()) {
    registered->second.instances.insert_or_assign(session, Admitted{plan.instance, instance});
  } else {
    // A program that connected on its own is a function of its own for as long as it lives.
    // It has no SLO of its own: the node's deadline alone.
    plan.kernel_deadline = std::chrono::nanoseconds(options_.kernel_deadline);
  }
  plan.quota_bytes = quota;
  return plan;
}

void Controller::withdraw(const std::string& function_id, SessionId session) {
  MutexLock lock(registry_mutex_);
  if (auto it = registry_.find(function_id); it != registry_.end()) {
    it->second.instances.erase(session);
  }
}

void Controller::attach(LeaseHolder* session) {
  const std::string& function_id = session->function_id();
  // The registration's function, or (a program that connected on its own) a new one.
  const auto [id, registered] = [&] {
    MutexLock lock(registry_mutex_);
    auto it = registry_.find(function_id);
    if (it != registry_.end() && it->second.instances.count(session->id()) != 0) {
      return std::pair(it->second.id, true);
    }
    return std::pair(FunctionId{next_function_++}, false);
  }();
  post([this, session, id, registered](State&) { on_attach(session, id, registered); });
}

void Controller::on_attach(LeaseHolder* session, FunctionId id, bool registered) {
  State& s = *state_;
  const std::string& function_id = session->function_id();
  const SessionId session_id = session->id();
  const scheduler::Time now = now_ns();
  if (registered) {
    if (s.function(id) == nullptr) {
      LOG(ERROR) << "session " << session_id << ": function '" << function_id
                 << "' is registered but unknown to the node core";
      return;
    }
  } else {
    // A process that connected on its own: a function of its own, with the default SLO.
    node::FunctionSpec spec;
    spec.name = str_cat(function_id, "#", session_id);
    spec.model_bytes = kUnknownModelBytes;
    spec.slo = options_.default_slo;
    Status added = s.core->add_function(id, spec, now);
    if (!added.ok()) {
      LOG(ERROR) << "session " << session_id << ": " << added;
      return;
    }
    State::Function function;
    function.name = spec.name;
    s.functions.emplace(id, std::move(function));
    s.by_name.emplace(spec.name, id);
  }
  const InstanceId instance = session->instance();
  Status attached = s.core->attach(instance, id, now);
  if (!attached.ok()) {
    LOG(ERROR) << "session " << session_id << ": " << attached;
    return;
  }
  s.instances.emplace(instance, State::Instance{.function = id,
                                                .session = session,
                                                .session_id = session_id,
                                                .key = session->instance_key(),
                                                .memory = session->memory()});
  s.by_session.emplace(session_id, instance);
  s.functions.at(id).instances.push_back(instance);
}

void Controller::detach(SessionId session) {
  call<bool>([this, session](State&) {
    on_detach(session);
    return true;
  });
}

void Controller::on_detach(SessionId session) {
  State& s = *state_;
  auto it = s.by_session.find(session);
  if (it == s.by_session.end()) return;
  const InstanceId instance = it->second;
  const FunctionId id = s.instances.at(instance).function;
  const scheduler::Time now = now_ns();
  // Its requests end and its replicas leave the view (its memory went with the session).
  s.core->detach(instance, now);
  // A context being reset waits for it no more: its objects went with it.
  forgotten(session, std::nullopt);
  s.instances.erase(instance);
  s.by_session.erase(it);
  State::Function& f = s.functions.at(id);
  std::erase(f.instances, instance);
  if (f.registered) {
    MutexLock lock(registry_mutex_);
    if (auto r = registry_.find(f.name); r != registry_.end()) r->second.instances.erase(session);
  } else {
    Status gone = s.core->remove_function(id, now);
    LOG_IF(ERROR, !gone.ok()) << "forgetting '" << f.name << "': " << gone;
    s.by_name.erase(f.name);
    s.functions.erase(id);
  }
}

// ---- Control calls ----

void Controller::register_function(const Registration& registration, Reply<Ok> reply) {
  Registration r = registration;
  if (r.tail_percentile == 0) r.tail_percentile = 0.98;
  if (r.function_id.empty() || r.function_id.find('#') != std::string::npos) {
    reply(error(ErrorCode::kInvalidValue,
                "registerFunction: a function id must be non-empty "
                "and must not contain '#'"));
    return;
  }
  if (!(r.slo > 0) || !(r.tail_percentile > 0 && r.tail_percentile < 1)) {
    reply(error(ErrorCode::kInvalidValue, "registerFunction '", r.function_id,
                "': the SLO must be > 0 "
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
  FunctionId id{0};
  {
    MutexLock lock(registry_mutex_);
    if (registry_.count(r.function_id) != 0) {
      reply(
          error(ErrorCode::kInvalidValue, "function '", r.function_id, "' is already registered"));
      return;
    }
    if (options_.max_registered_functions != 0 &&
        registry_.size() >= options_.max_registered_functions) {
      reply(error(ErrorCode::kDeviceUnavailable, "registerFunction '", r.function_id,
                  "': hiberd already has ", registry_.size(),
                  " registered functions, the most --max_registered_functions allows; "
                  "unregister one first"));
      return;
    }
    id = FunctionId{next_function_++};
    registry_.emplace(r.function_id, Registered{r, id});
  }
  post([this, r, id, reply = std::move(reply)](State&) mutable { on_register(r, id, reply); });
}

void Controller::on_register(const Registration& r, FunctionId id, Reply<Ok>& reply) {
  State& s = *state_;
  Status added = s.core->add_function(id, function_spec(r), now_ns());
  if (!added.ok()) {
    MutexLock lock(registry_mutex_);
    registry_.erase(r.function_id);
    reply(added);
    return;
  }
  State::Function function;
  function.name = r.function_id;
  function.registered = true;
  function.registration = r;
  s.functions.emplace(id, std::move(function));
  s.by_name.emplace(r.function_id, id);
  LOG(INFO) << "registered function '" << r.function_id << "': SLO " << r.slo / 1e6 << " ms at p"
            << r.tail_percentile * 100 << (r.stateful ? ", stateful" : "");
  if (options_.registered) options_.registered(r);
  reply(Ok{});
}

void Controller::unregister_function(const std::string& function_id, Reply<Ok> reply) {
  post([this, function_id, reply = std::move(reply)](State&) mutable {
    on_unregister(function_id, reply);
  });
}

void Controller::on_unregister(const std::string& function_id, Reply<Ok>& reply) {
  State& s = *state_;
  State::Function* f = s.function_named(function_id);
  if (f == nullptr || !f->registered) {
    reply(error(ErrorCode::kNotFound, "function '", function_id, "' is not registered"));
    return;
  }
  if (!f->instances.empty()) {
    const State::Instance& first = s.instances.at(f->instances.front());
    reply(error(ErrorCode::kIllegalState, "function '", function_id, "' still has ",
                f->instances.size(), " connected instance(s) (session ", first.session_id,
                f->instances.size() > 1 ? " and others" : "", "); stop them first"));
    return;
  }
  const FunctionId id = s.by_name.at(function_id);
  Status gone = s.core->remove_function(id, now_ns());
  if (!gone.ok()) {
    reply(gone);
    return;
  }
  s.by_name.erase(function_id);
  s.functions.erase(id);
  {
    MutexLock lock(registry_mutex_);
    registry_.erase(function_id);
  }
  if (options_.unregistered) options_.unregistered(function_id);
  reply(Ok{});
}

void Controller::request_arrived(const std::string& function_id, const std::string& instance,
                                 Reply<uint64_t> reply) {
  post([this, function_id, instance, reply = std::move(reply)](State&) mutable {
    on_arrived(function_id, instance, reply);
  });
}

void Controller::on_arrived(const std::string& function_id, const std::string& instance,
                            Reply<uint64_t>& reply) {
  State& s = *state_;
  State::Function* f = s.function_named(function_id);
  if (f == nullptr || !f->registered) {
    reply(error(ErrorCode::kNotFound, "requestArrived: function '", function_id,
                "' is not registered"));
    return;
  }
  // The instance named is the router's worker that gets the request; without one the core
  // chooses (NodeCore::arrive).
  std::optional<InstanceId> named;
  if (!instance.empty()) {
    for (InstanceId i : f->instances) {
      if (s.instances.at(i).key == instance) named = i;
    }
    if (!named) {
      reply(error(ErrorCode::kDeviceUnavailable, "requestArrived: function '", function_id,
                  "' has no connected instance '", instance, "' (", f->instances.size(),
                  " other instance(s) are connected)"));
      return;
    }
  }
  Result<RequestId> id = s.core->arrive(s.by_name.at(function_id), named, now_ns());
  if (!id.ok()) {
    reply(id.status().with_context("requestArrived"));
    return;
  }
  reply(id->value());
}

void Controller::request_start(uint64_t request, Reply<wire::Started> reply) {
  post([this, request, reply = std::move(reply)](State&) mutable {
    on_start(RequestId{request}, std::move(reply), "requestStart");
  });
}

void Controller::on_start(RequestId id, Reply<wire::Started> reply, const char* call) {
  State& s = *state_;
  if (s.start_replies.count(id) != 0) {
    reply(error(ErrorCode::kInvalidValue, call, ": request ", id.value(),
                " is already being waited for"));
    return;
  }
  auto [slot, inserted] = s.start_replies.emplace(id, std::move(reply));
  Status waiting = s.core->await_start(id, now_ns());
  if (!waiting.ok()) {
    Reply<wire::Started> refused = std::move(slot->second);
    s.start_replies.erase(slot);
    refused(waiting.with_context(call));
  }
}

void Controller::request_begin(const std::string& function_id, const std::string& instance,
                               Reply<wire::Started> reply) {
  post([this, function_id, instance, reply = std::move(reply)](State&) mutable {
    Result<uint64_t> arrived = Status(ErrorCode::kUnknown, "requestBegin: no answer");
    Reply<uint64_t> take = [&arrived](Result<uint64_t> id) { arrived = std::move(id); };
    on_arrived(function_id, instance, take);
    if (!arrived.ok()) {
      reply(arrived.status());
      return;
    }
    const RequestId id{*arrived};
    on_start(
        id,
        [this, id, reply = std::move(reply)](Result<wire::Started> started) {
          if (!started.ok()) {
            // Not from inside the core's callback: the core is answering this start.
            post([this, id](State& s) { (void)s.core->done(id, /*failed=*/true, now_ns()); });
            reply(started.status());
            return;
          }
          started->request_id = id.value();
          reply(std::move(started));
        },
        "requestBegin");
  });
}

void Controller::request_done(uint64_t request, bool failed, Reply<Ok> reply) {
  post([this, request, failed, reply = std::move(reply)](State& s) {
    Status done = s.core->done(RequestId{request}, failed, now_ns());
    if (!done.ok()) {
      reply(done.with_context("requestDone"));
      return;
    }
    reply(Ok{});
  });
}

void Controller::drain(int gpu, bool resume, Reply<Ok> reply) {
  post([this, gpu, resume, reply = std::move(reply)](State&) mutable {
    on_drain(gpu, resume, reply);
  });
}

void Controller::on_drain(int gpu, bool resume, Reply<Ok>& reply) {
  State& s = *state_;
  if (gpu < -1) {
    reply(error(ErrorCode::kInvalidDevice, "drain: no GPU ", gpu));
    return;
  }
  const std::optional<GpuId> target = gpu < 0 ? std::nullopt : std::optional<GpuId>(GpuId{gpu});
  // The reply waits in line before the core may report the drain done.
  if (!resume) s.drain_replies.emplace_back(target, std::move(reply));
  Status drained = s.core->drain(target, resume);
  if (resume) {
    drained.ok() ? reply(Ok{}) : reply(drained);
    return;
  }
  if (!drained.ok()) {
    Reply<Ok> refused = std::move(s.drain_replies.back().second);
    s.drain_replies.pop_back();
    refused(drained);
  }
}

void Controller::status(Reply<ControllerStatus> reply) {
  post([this, reply = std::move(reply)](State&) { reply(on_status()); });
}

ControllerStatus Controller::on_status() {
  State& s = *state_;
  const node::NodeStatus core = s.core->status(now_ns());
  ControllerStatus out;
  for (int g = 0; g < static_cast<int>(core.gpus.size()); ++g) {
    const node::NodeStatus::Gpu& in = core.gpus[g];
    ControllerStatus::Gpu gpu;
    gpu.healthy = in.healthy;
    gpu.drained = in.drained;
    if (in.running) {
      if (const State::Instance* i = s.instance(*in.running)) {
        gpu.running = s.functions.at(i->function).name;
      }
    }
    gpu.pool_bytes = pools_->pool_bytes(g);
    gpu.pool = pools_->pools().stats(g);
    gpu.swaps_in = in.swaps_in;
    gpu.swap_in_bytes = in.swap_in_bytes;
    gpu.swap_in_seconds = in.swap_in_seconds;
    gpu.evictions = in.evictions;
    gpu.evictions_by_reason = in.evictions_by_reason;
    out.gpus.push_back(gpu);
  }
  // One entry per function, its instances summed (the core sums their statistics).
  for (const node::NodeStatus::Function& in : core.functions) {
    const State::Function* known = s.function(in.id);
    if (known == nullptr) continue;
    ControllerStatus::Function f;
    f.function_id = known->name;
    f.registered = known->registered;
    f.stateful = in.stateful;
    f.heavy = in.heavy;
    f.rrc = in.rrc;
    f.requests = in.requests;
    f.on_time = in.on_time;
    for (GpuId g : in.resident_gpus) f.resident_gpus.push_back(g.value());
    for (InstanceId id : in.instances) {
      const State::Instance* instance = s.instance(id);
      if (instance == nullptr || !instance->memory) continue;
      f.model_bytes = std::max(f.model_bytes, instance->memory->model_bytes());
      f.host_copy_bytes += instance->memory->host_bytes();
    }
    f.instances = static_cast<uint32_t>(in.instances.size());
    out.functions.push_back(std::move(f));
  }
  std::sort(out.functions.begin(), out.functions.end(),
            [](const auto& a, const auto& b) { return a.function_id < b.function_id; });
  out.placement = options_.scheduler.placement;
  out.eviction = options_.scheduler.eviction;
  out.queue = options_.scheduler.queue;
  out.queued = core.queued;
  out.counters = core.counters;
  out.preemptions = core.preemptions;
  out.swap_group_bytes = group_bytes_;
  out.host_pool = repository_->stats();
  out.draining = core.draining;
  out.swaps_by_link = core.swaps_by_link;
  out.swap_seconds = core.swap_seconds;
  return out;
}

// ---- GpuLessor: what sessions report ----

void Controller::need_gpu(SessionId session) {
  post([session](State& s) {
    auto it = s.by_session.find(session);
    if (it != s.by_session.end()) s.core->need_gpu(it->second, now_ns());
  });
}

void Controller::streaming(SessionId, RequestId lease, const Status& status, bool moves_nothing) {
  post([lease, status, moves_nothing](State& s) {
    s.core->streaming(lease, status, now_ns(), moves_nothing);
  });
}

void Controller::swap_done(SessionId session, RequestId lease, const Status& status,
                           const SwapReport& report) {
  post([session, lease, status, report](State& s) {
    // Device callbacks cannot unmap the sources of finished peer copies; this thread can.
    if (State::Instance* i = s.instance_of_session(session); i != nullptr && i->memory) {
      i->memory->retire_windows();
    }
    s.core->swap_done(lease, status, node::SwapStats{report.bytes, report.duration_ns}, now_ns());
  });
}

void Controller::released(SessionId, RequestId lease, const Status& status) {
  post([this, lease, status](State& s) {
    if (options_.isolation == Isolation::kShared && device::is_context_fault(status.code())) {
      begin_reset(lease, status);
    }
    s.core->released(lease, status, now_ns());
  });
}

void Controller::context_forgotten(SessionId session, GpuId gpu) {
  post([this, session, gpu](State&) { forgotten(session, gpu); });
}

// ---- Shared mode: resetting a GPU's shared context after a fault ----

void Controller::begin_reset(RequestId lease, const Status& fault) {
  State& s = *state_;
  std::optional<GpuId> gpu;
  for (int g = 0; g < s.core->gpu_count(); ++g) {
    if (s.core->running(GpuId{g}) == lease) gpu = GpuId{g};
  }
  if (!gpu || s.resets.contains(*gpu)) return;  // not running (it ended already), or known
  LOG(WARNING) << "GPU " << *gpu << ": a fault ended its shared context (" << fault
               << "); resetting it (--isolation=shared): the GPU takes no new requests until "
               << "every session has forgotten its objects there";
  (void)s.core->hold_gpu(*gpu, true);
  State::Reset& reset = s.resets[*gpu];
  reset.fault = fault;
  // Their answers come as events of this thread, so none can arrive before the set is full.
  for (const auto& [session, id] : s.by_session) {
    if (State::Instance* i = s.instance(id); i != nullptr && i->session != nullptr) {
      reset.waiting.insert(session);
      i->session->forget_shared_context(*gpu);
    }
  }
  if (reset.waiting.empty()) finish_reset(*gpu);
}

void Controller::forgotten(SessionId session, std::optional<GpuId> gpu) {
  State& s = *state_;
  std::vector<GpuId> ready;
  for (auto& [g, reset] : s.resets) {
    if (gpu && g != *gpu) continue;
    if (reset.waiting.erase(session) != 0 && reset.waiting.empty()) ready.push_back(g);
  }
  for (GpuId g : ready) finish_reset(g);
}

void Controller::finish_reset(GpuId gpu) {
  State& s = *state_;
  const Status fault = s.resets.at(gpu).fault;
  s.resets.erase(gpu);
  // The controller's own stream there went with the context: forgotten, not destroyed.
  s.service[gpu.value()].reset();
  const Status reset = device_.reset_shared_context(gpu.value());
  if (!reset.ok()) {
    s.core->fail_gpu(gpu, reset.with_context("resetting its shared context after a fault"));
    return;
  }
  (void)s.core->hold_gpu(gpu, false);
  LOG(WARNING) << "GPU " << gpu << ": its shared context was reset after the fault (" << fault
               << "); it takes requests again, and its models stayed on it";
}

Status Controller::make_room(SessionId session, GpuId gpu, const memory::Shortfall& shortfall) {
  return call<Status>([session, gpu, &shortfall](State& s) {
    auto it = s.by_session.find(session);
    if (it == s.by_session.end()) return error(ErrorCode::kOutOfMemory, "no room on GPU ", gpu);
    if (shortfall.over_quota) {
      // Its own quota is the limit: evicting other functions would not help.
      return error(ErrorCode::kOutOfMemory, "GPU ", gpu, ": ", shortfall.describe());
    }
    return s.core->make_room(it->second, gpu, shortfall.needed_bytes, now_ns());
  });
}

// ---- node::Actuator ----

Result<uint64_t> Controller::evict(InstanceId instance, GpuId gpu) {
  State::Instance* i = state_->instance(instance);
  if (i == nullptr || !i->memory) return uint64_t{0};
  HIBER_ASSIGN_OR_RETURN(device::Stream stream, service_stream(gpu));
  return i->memory->evict(gpu, stream);
}

void Controller::forget(InstanceId instance, GpuId gpu) {
  State::Instance* i = state_->instance(instance);
  if (i != nullptr && i->memory) i->memory->forget(gpu);
}

void Controller::start(const node::Start& start) {
  State::Instance* i = state_->instance(start.instance);
  if (i == nullptr || i->session == nullptr) {
    // The core starts attached instances only; an instance is attached while its session lives.
    LOG(DFATAL) << "start of request " << start.request << " for instance " << start.instance
                << ", which has no session";
    return;
  }
  Lease lease{.id = start.request, .gpus = GpuSet::of(start.gpu)};
  lease.implicit = start.background;
  lease.source = start.source;
  lease.source_gpu = start.source_gpu;
  lease.release_source = start.release_source;
  lease.first_request = start.first_request;
  i->session->grant(lease);
}

void Controller::end(RequestId request, InstanceId instance, const Status& failure) {
  State::Instance* i = state_->instance(instance);
  if (i == nullptr || i->session == nullptr) return;  // its detach ends the request
  if (failure.ok()) {
    i->session->end_lease(request);
  } else {
    i->session->fail(request, failure);
  }
}

void Controller::answer_start(RequestId request, const Result<node::StartInfo>& answer) {
  auto it = state_->start_replies.find(request);
  if (it == state_->start_replies.end()) return;
  Reply<wire::Started> reply = std::move(it->second);
  state_->start_replies.erase(it);
  if (!answer.ok()) {
    reply(answer.status());
    return;
  }
  const int source_gpu = answer->source_gpu ? answer->source_gpu->value() : -1;
  const std::optional<node::SwapLink> link =
      node::swap_link(*topology_, answer->source, source_gpu, answer->gpu.value());
  reply(wire::Started{.gpu = answer->gpu.value(),
                      .source = scheduler::source_name(answer->source),
                      .source_gpu = source_gpu,
                      .rule = scheduler::placement_rule_name(answer->rule),
                      .queued_ms = static_cast<double>(answer->queued) / 1e6,
                      .link = link ? node::swap_link_name(*link) : ""});
}

// answer_start() has given the router the "overloaded" error already (or will, when it asks);
// the router passes it on as 503 and says done, which ends the request in the core.
void Controller::rejected(RequestId request, InstanceId instance, const Status& why) {
  VLOG(1) << "request " << request << " of instance " << instance << " shed: " << why;
}

void Controller::drained(std::optional<GpuId> gpu) {
  auto& replies = state_->drain_replies;
  auto it = std::find_if(replies.begin(), replies.end(),
                         [&](const auto& entry) { return entry.first == gpu; });
  if (it == replies.end()) return;
  Reply<Ok> reply = std::move(it->second);
  replies.erase(it);
  reply(Ok{});
}

uint64_t Controller::pool_allocated(GpuId gpu) const {
  return pools_->pools().stats(gpu.value()).allocated_bytes;
}

uint64_t Controller::placed_bytes(InstanceId instance, GpuId gpu) const {
  const State::Instance* i = state_->instance(instance);
  return i != nullptr && i->memory ? i->memory->placed_bytes(gpu) : 0;
}

uint64_t Controller::model_bytes(InstanceId instance) const {
  const State::Instance* i = state_->instance(instance);
  return i != nullptr && i->memory ? i->memory->model_bytes() : kUnknownModelBytes;
}

Result<device::Stream> Controller::service_stream(GpuId gpu) {
  std::optional<device::Stream>& stream = state_->service[gpu.value()];
  if (!stream) {
    HIBER_ASSIGN_OR_RETURN(device::Stream made, device_.create_stream(gpu.value(), 0));
    stream = made;
  }
  return *stream;
}

}  // namespace hiber::server
