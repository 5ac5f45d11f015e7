#include "node/node_core.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include <glog/logging.h>

namespace hiber::node {
namespace {

using scheduler::Decision;
using scheduler::Source;

int index_of(GpuId gpu) { return gpu.value(); }

}  // namespace

const char* swap_link_name(SwapLink link) {
  switch (link) {
    case SwapLink::kNvlink: return "nvlink";
    case SwapLink::kPcie: return "pcie";
    case SwapLink::kHost: return "host";
  }
  return "?";
}

std::optional<SwapLink> swap_link(const scheduler::Topology& topology, Source source,
                                  int source_gpu, int gpu) {
  switch (source) {
    case Source::kResident: return std::nullopt;
    case Source::kHost: return SwapLink::kHost;
    case Source::kPeer:
      return source_gpu >= 0 && topology.peer_gbps(source_gpu, gpu) > 0 ? SwapLink::kNvlink
                                                                        : SwapLink::kPcie;
  }
  return std::nullopt;
}

const char* eviction_reason_name(EvictionReason reason) {
  switch (reason) {
    case EvictionReason::kPlacement: return "placement";
    case EvictionReason::kMemory: return "memory";
    case EvictionReason::kDrain: return "drain";
  }
  return "?";
}

struct NodeCore::State {
  struct Function {
    FunctionSpec spec;
    // Its slots, the scheduler's ids for them: the first is the function's own id, the others
    // the core's (kFirstOwnId and up), in the order they were made.
    std::vector<FunctionId> slots;
  };
  // One scheduler entry of a function, which one instance at a time runs as.
  struct Slot {
    FunctionId function;
    std::optional<InstanceId> instance;  // attached now
    uint64_t attached_at = 0;            // the order instances attached in, for arrive()'s choice
    // A caller's request was granted: what the instance loaded before is its model, fixed.
    bool model_fixed = false;
    std::optional<RequestId> background_queued;  // need_gpu()'s request, not yet placed
    std::optional<RequestId> lease;              // placed and not yet released
  };
  struct Request {
    FunctionId slot;  // the scheduler's id of the slot it runs in
    Phase phase = Phase::kQueued;
    bool background = false;
    Time arrival = 0;
    bool swap_in_flight = false;  // a swap was started and has not reported
    bool moved_nothing = false;   // its load from the host found the model in place
    bool failed = false;          // the caller said so, or its GPU failed
    bool done_said = false;       // done() came
    bool awaited = false;         // await_start() waits for an answer
    bool release_source = false;
    bool drop_source_from_view = false;
    Time placed = 0;                   // when dispatch() started it
    std::optional<Decision> decision;  // once placed
    Status start_error;
    std::optional<InstanceId> instance;  // its slot's when it arrived
  };
  struct Gpu {
    bool healthy = true;
    bool drained = false;
    std::optional<RequestId> running;
    std::vector<RequestId> sharing;  // started beside `running` (spatial sharing)
    uint64_t swaps_in = 0;
    uint64_t swap_in_bytes = 0;
    double swap_in_seconds = 0;
    uint64_t evictions = 0;
    std::array<uint64_t, kEvictionReasons> evictions_by_reason{};
    uint64_t reported_reserved = UINT64_MAX;
  };

  std::unordered_map<FunctionId, Function> functions;
  std::unordered_map<FunctionId, Slot> slots;          // by the scheduler's id
  std::unordered_map<InstanceId, FunctionId> slot_of;  // attached instances
  uint32_t next_own_id = kFirstOwnId;
  uint64_t attachments = 0;
  // Not a vector indexed by the scheduler's slot: a request that ended before its caller said
  // done() outlives its scheduler slot, which a later request may then reuse.
  std::unordered_map<RequestId, Request> requests;
  std::vector<Gpu> gpus;
  bool draining = false;
  std::array<NodeStatus::LinkSwaps, kSwapLinks> swaps_by_link{};
  Histogram swap_seconds{swap_seconds_bounds()};
  uint64_t preemptions = 0;  // background requests preempt() ended
  // GPUs whose memory changed since the scheduler last heard their reserve: it is told before it
  // decides (dispatch, make_room), once however many changes came in between.
  scheduler::GpuMask stale_reserves = 0;
  // Drains not yet reported, in the order they were asked for.
  std::vector<std::optional<GpuId>> drains;

  // `id` no longer runs on g; the first request sharing g takes the place of a running one.
  void clear_runner(Gpu& g, RequestId id) {
    if (g.running != id) {
      std::erase(g.sharing, id);
      return;
    }
    g.running.reset();
    if (!g.sharing.empty()) {
      g.running = g.sharing.front();
      g.sharing.erase(g.sharing.begin());
    }
  }
  // The requests executing on g: the running one, then those sharing it.
  static std::vector<RequestId> runners(const Gpu& g) {
    std::vector<RequestId> out;
    if (g.running) out.push_back(*g.running);
    out.insert(out.end(), g.sharing.begin(), g.sharing.end());
    return out;
  }

  Function* function(FunctionId id) {
    auto it = functions.find(id);
    return it == functions.end() ? nullptr : &it->second;
  }
  Slot* slot(FunctionId id) {
    auto it = slots.find(id);
    return it == slots.end() ? nullptr : &it->second;
  }
  // The slot's instance, while one is attached.
  std::optional<InstanceId> instance(FunctionId slot_id) const {
    auto it = slots.find(slot_id);
    return it == slots.end() ? std::nullopt : it->second.instance;
  }
  const std::string& name(FunctionId slot_id) const {
    static const std::string unknown = "?";
    auto it = slots.find(slot_id);
    if (it == slots.end()) return unknown;
    return functions.at(it->second.function).spec.name;
  }
  Request* request(RequestId id) {
    auto it = requests.find(id);
    return it == requests.end() ? nullptr : &it->second;
  }
};

// ---- Creation ----

NodeCore::NodeCore(const scheduler::Topology& topology, const NodeOptions& options,
                   Actuator& actuator)
    : topology_(topology),
      options_(options),
      actuator_(actuator),
      state_(std::make_unique<State>()) {}

NodeCore::~NodeCore() = default;

Result<std::unique_ptr<NodeCore>> NodeCore::create(const scheduler::Topology& topology,
                                                   const NodeOptions& options, Actuator& actuator,
                                                   const scheduler::FutureOracle* oracle) {
  const int gpus = topology.gpu_count();
  if (!options.outside_pool_bytes.empty() &&
      options.outside_pool_bytes.size() != static_cast<size_t>(gpus)) {
    return error(ErrorCode::kInvalidValue, "node core: ", options.outside_pool_bytes.size(),
                 " outside-pool sizes for ", gpus, " GPUs");
  }
  std::unique_ptr<NodeCore> core(new NodeCore(topology, options, actuator));
  HIBER_ASSIGN_OR_RETURN(core->scheduler_,
                         scheduler::Scheduler::create(topology, options.scheduler, oracle));
  core->state_->gpus.resize(gpus);
  for (int g = 0; g < gpus; ++g) core->update_reserved(GpuId{g});
  return core;
}

int NodeCore::gpu_count() const { return static_cast<int>(state_->gpus.size()); }

// ---- Functions and instances ----

namespace {

scheduler::FunctionSpec scheduler_spec(const FunctionSpec& spec) {
  scheduler::FunctionSpec s;
  s.name = spec.name;
  s.model_bytes = spec.model_bytes;
  s.slo = spec.slo;
  s.tail_percentile = spec.tail_percentile;
  s.heavy_hint = spec.heavy_hint;
  s.exec_time_hint = spec.exec_time_hint;
  s.intensity = spec.intensity;
  return s;
}

}  // namespace

Status NodeCore::add_function(FunctionId id, const FunctionSpec& spec, Time now) {
  if (id.value() >= kFirstOwnId) {
    return error(ErrorCode::kInvalidValue, "function id ", id, " ('", spec.name,
                 "') is one of the node core's own");
  }
  if (state_->functions.count(id) != 0) {
    return error(ErrorCode::kInvalidValue, "function ", id, " ('", spec.name, "') exists already");
  }
  // Its first slot is registered now, under its own id: a function with one instance is to the
  // scheduler what it was before instances.
  HIBER_RETURN_IF_ERROR(scheduler_->register_function(id, scheduler_spec(spec), now));
  State::Function f;
  f.spec = spec;
  f.slots.push_back(id);
  state_->functions.emplace(id, std::move(f));
  state_->slots.emplace(id, State::Slot{.function = id});
  return Status();
}

Result<FunctionId> NodeCore::add_slot(FunctionId function, Time now) {
  State::Function& f = state_->functions.at(function);
  if (state_->next_own_id == UINT32_MAX) {
    return error(ErrorCode::kOutOfMemory, "function '", f.spec.name,
                 "': the node core has no instance slot ids left");
  }
  const FunctionId id{state_->next_own_id};
  FunctionSpec spec = f.spec;
  spec.name = str_cat(f.spec.name, "/", f.slots.size());
  HIBER_RETURN_IF_ERROR(scheduler_->register_function(id, scheduler_spec(spec), now));
  ++state_->next_own_id;
  f.slots.push_back(id);
  state_->slots.emplace(id, State::Slot{.function = function});
  return id;
}

Status NodeCore::remove_function(FunctionId id, Time now) {
  State::Function* f = state_->function(id);
  if (f == nullptr) return error(ErrorCode::kNotFound, "function ", id, " is unknown");
  for (FunctionId slot : f->slots) {
    if (state_->slots.at(slot).instance) {
      return error(ErrorCode::kIllegalState, "function '", f->spec.name,
                   "' still has an instance attached");
    }
  }
  for (FunctionId slot : f->slots) {
    std::vector<scheduler::RequestId> cancelled;
    HIBER_RETURN_IF_ERROR(scheduler_->unregister_function(slot, now, &cancelled));
    // Requests that outlived the instance (ended, awaiting the caller's done) go too.
    std::vector<RequestId> mine;
    for (const auto& [rid, r] : state_->requests) {
      if (r.slot == slot) mine.push_back(rid);
    }
    for (RequestId rid : mine) {
      State::Request& r = state_->requests.at(rid);
      if (r.awaited) {
        r.start_error =
            error(ErrorCode::kDeinitialized, "function '", f->spec.name, "' was removed");
        answer_start(rid, now);
      }
      state_->requests.erase(rid);
    }
    state_->slots.erase(slot);
  }
  state_->functions.erase(id);
  return Status();
}

bool NodeCore::has_function(FunctionId id) const { return state_->functions.count(id) != 0; }

Status NodeCore::attach(InstanceId instance, FunctionId function, Time now) {
  State::Function* f = state_->function(function);
  if (f == nullptr) return error(ErrorCode::kNotFound, "function ", function, " is unknown");
  if (state_->slot_of.count(instance) != 0) {
    return error(ErrorCode::kInvalidValue, "instance ", instance, " is attached already");
  }
  std::optional<FunctionId> free;
  for (FunctionId slot : f->slots) {
    if (!state_->slots.at(slot).instance) {
      free = slot;
      break;
    }
  }
  if (!free) {
    HIBER_ASSIGN_OR_RETURN(free, add_slot(function, now));
  }
  State::Slot& slot = state_->slots.at(*free);
  slot.instance = instance;
  slot.attached_at = ++state_->attachments;
  slot.model_fixed = false;
  state_->slot_of.emplace(instance, *free);
  return Status();
}

void NodeCore::detach(InstanceId instance, Time now) {
  auto found = state_->slot_of.find(instance);
  if (found == state_->slot_of.end()) return;
  const FunctionId id = found->second;
  State::Slot& slot = state_->slots.at(id);
  const std::string& name = state_->name(id);
  // Its requests end: queued ones are withdrawn, the running one failed (the instance's work
  // drained when it went, so its GPU is free).
  std::vector<RequestId> mine;
  for (const auto& [rid, r] : state_->requests) {
    if (r.slot == id) mine.push_back(rid);
  }
  std::sort(mine.begin(), mine.end());
  for (RequestId rid : mine) {
    State::Request& r = state_->requests.at(rid);
    if (r.awaited) {
      r.start_error = error(ErrorCode::kDeinitialized, "the instance of '", name,
                            "' exited before its request started");
      answer_start(rid, now);
    }
    if (r.phase == Phase::kEnded) {
      state_->requests.erase(rid);
      continue;
    }
    if (r.swap_in_flight) (void)scheduler_->load_done(rid, now, false);
    if (r.phase == Phase::kQueued) {
      (void)scheduler_->cancel(rid, now);
    } else {
      (void)scheduler_->done(rid, now, scheduler::Completion{.failed = true});
      state_->clear_runner(state_->gpus[r.decision->gpu], rid);
    }
    state_->requests.erase(rid);
  }
  // Its memory went with the instance.
  for (int g = 0; g < gpu_count(); ++g) scheduler_->drop_replica(g, id);
  slot.instance.reset();
  slot.lease.reset();
  slot.background_queued.reset();
  state_->slot_of.erase(found);
  for (int g = 0; g < gpu_count(); ++g) reserve_changed(GpuId{g});
}

std::optional<FunctionId> NodeCore::function_of(InstanceId instance) const {
  auto it = state_->slot_of.find(instance);
  if (it == state_->slot_of.end()) return std::nullopt;
  return state_->slots.at(it->second).function;
}

// ---- Requests ----

Result<RequestId> NodeCore::arrive(FunctionId function, std::optional<InstanceId> instance,
                                   Time now) {
  State::Function* f = state_->function(function);
  if (f == nullptr) return error(ErrorCode::kNotFound, "function ", function, " is unknown");
  if (state_->draining) return error(ErrorCode::kDeviceUnavailable, "the node is draining");
  std::optional<FunctionId> chosen;
  if (instance) {
    auto it = state_->slot_of.find(*instance);
    if (it == state_->slot_of.end() || state_->slots.at(it->second).function != function) {
      return error(ErrorCode::kDeviceUnavailable, "function '", f->spec.name,
                   "' has no connected instance ", *instance);
    }
    chosen = it->second;
  } else {
    std::vector<FunctionId> attached;
    for (FunctionId slot : f->slots) {
      if (state_->slots.at(slot).instance) attached.push_back(slot);
    }
    if (attached.size() == 1) {
      chosen = attached.front();
    } else if (!attached.empty()) {
      // The least busy instance (its callers' requests not yet done), then one that can start
      // without a swap, then the one attached first.
      std::unordered_map<FunctionId, uint64_t> open;
      for (const auto& [rid, r] : state_->requests) {
        if (!r.background && !r.done_said && r.phase != Phase::kEnded) ++open[r.slot];
      }
      const scheduler::FunctionTable& table = scheduler_->functions();
      auto rank = [&](FunctionId slot) {
        const std::optional<scheduler::FunctionIndex> index = table.find(slot);
        const bool resident = index && scheduler_->node().holders(*index) != 0;
        return std::make_tuple(open[slot], !resident, state_->slots.at(slot).attached_at);
      };
      chosen = *std::min_element(attached.begin(), attached.end(),
                                 [&](FunctionId a, FunctionId b) { return rank(a) < rank(b); });
    }
  }
  if (!chosen) {
    return error(ErrorCode::kDeviceUnavailable, "function '", f->spec.name,
                 "' has no connected instance");
  }
  // What the instance has loaded by now (its start-up) is what this request's placement must
  // make room for.
  learn_model_bytes(*chosen);
  HIBER_ASSIGN_OR_RETURN(scheduler::RequestId arrived, scheduler_->arrive(*chosen, now));
  const RequestId rid = arrived;
  State::Request r{.slot = *chosen};
  r.arrival = now;
  r.instance = state_->slots.at(*chosen).instance;
  state_->requests.emplace(rid, std::move(r));
  return rid;
}

std::optional<InstanceId> NodeCore::instance_of(RequestId request) const {
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) return std::nullopt;
  return it->second.instance;
}

void NodeCore::need_gpu(InstanceId instance, Time now) {
  auto found = state_->slot_of.find(instance);
  if (found == state_->slot_of.end()) return;
  const FunctionId id = found->second;
  State::Slot& slot = state_->slots.at(id);
  // A lease is on its way or held (the instance asked before it saw the grant).
  if (slot.lease || slot.background_queued) return;
  // A queued caller request will give it a lease; its work runs under that.
  for (const auto& [rid, r] : state_->requests) {
    if (r.slot == id && !r.background && r.phase != Phase::kEnded) return;
  }
  // Its start-up allocated what it is loading now: the placement must make room for that.
  learn_model_bytes(id);
  // Background: the instance's own use of a GPU is not one of its callers' requests, and must
  // not weigh on its SLO statistics (RRC) or its execution times.
  auto arrived = scheduler_->arrive(id, now, /*background=*/true);
  if (!arrived.ok()) {
    LOG(ERROR) << "function '" << state_->name(id)
               << "': cannot queue a background request: " << arrived.status();
    return;
  }
  const RequestId rid = *arrived;
  State::Request r{.slot = id};
  r.background = true;
  r.arrival = now;
  r.instance = instance;
  state_->requests.emplace(rid, std::move(r));
  slot.background_queued = rid;
}

Status NodeCore::await_start(RequestId id, Time now) {
  State::Request* r = state_->request(id);
  if (r == nullptr || r->background) {
    return error(ErrorCode::kNotFound, "no request ", id,
                 " is waiting (unknown, finished or withdrawn)");
  }
  if (r->awaited) {
    return error(ErrorCode::kInvalidValue, "request ", id, " is already being waited for");
  }
  r->awaited = true;
  // A request that ended had either run (the answer says where) or failed to start (the error
  // says why): released() sets start_error for one that never ran.
  if (r->phase == Phase::kRunning || r->phase == Phase::kEnding || r->phase == Phase::kEnded ||
      !r->start_error.ok()) {
    answer_start(id, now);
  }
  return Status();
}

Status NodeCore::done(RequestId id, bool failed, Time now) {
  State::Request* r = state_->request(id);
  if (r == nullptr || r->background || r->done_said) {
    return error(ErrorCode::kNotFound, "no request ", id, " is running (unknown or finished)");
  }
  r->done_said = true;
  r->failed |= failed;
  switch (r->phase) {
    case Phase::kEnded:
      // Its work ended already; now the caller knows.
      state_->requests.erase(id);
      return Status();
    case Phase::kQueued:
      (void)scheduler_->cancel(id, now);
      if (r->awaited) {
        r->start_error = error(ErrorCode::kDeinitialized, "request ", id, " was marked done");
        answer_start(id, now);
      }
      state_->requests.erase(id);
      return Status();
    case Phase::kPlacing:
    case Phase::kRunning:
      r->phase = Phase::kEnding;
      // The GPU is free once the instance's work there has drained (released()).
      if (r->instance) actuator_.end(id, *r->instance, Status());
      return Status();
    case Phase::kEnding: return Status();
  }
  return Status();
}

// ---- Reports ----

void NodeCore::streaming(RequestId id, const Status& status, Time now, bool moves_nothing) {
  State::Request* r = state_->request(id);
  if (r == nullptr) return;
  if (status.ok()) {
    if (r->phase == Phase::kPlacing) r->phase = Phase::kRunning;
    // Nothing came from elsewhere: what the caller is told, and what the counters say, is that
    // the model was resident. The swap still ends (swap_done) for the scheduler's accounting.
    // (A peer copy that finds its blocks in place still settles its source replica in
    // swap_done, so only a load from the host is turned into residence.)
    if (moves_nothing && r->decision && r->decision->source == Source::kHost) {
      r->decision->source = Source::kResident;
      r->moved_nothing = true;
    }
  } else {
    r->start_error = status;
    r->failed = true;
  }
  answer_start(id, now);
}

void NodeCore::swap_done(RequestId id, const Status& status, const SwapStats& stats, Time now) {
  State::Request* r = state_->request(id);
  if (r == nullptr || !r->swap_in_flight) return;
  r->swap_in_flight = false;
  const GpuId gpu{r->decision->gpu};
  (void)scheduler_->load_done(id, now, status.ok());
  if (!status.ok()) {
    r->failed = true;
    fail_gpu(gpu, status.with_context("swapping a model in"));
    return;
  }
  // A start that moved nothing was answered as resident (streaming): it is no swap. The swap's
  // end may be reported before its streaming (nothing to copy ends at once, on another thread),
  // so its bytes say it too.
  if (!r->moved_nothing && stats.bytes > 0) {
    State::Gpu& g = state_->gpus[index_of(gpu)];
    ++g.swaps_in;
    g.swap_in_bytes += stats.bytes;
    g.swap_in_seconds += static_cast<double>(stats.duration) / 1e9;
    if (const std::optional<SwapLink> link =
            swap_link(topology_, r->decision->source, r->decision->source_gpu, gpu.value())) {
      NodeStatus::LinkSwaps& by_link = state_->swaps_by_link[static_cast<size_t>(*link)];
      ++by_link.swaps;
      by_link.bytes += stats.bytes;
    }
    state_->swap_seconds.observe(static_cast<double>(stats.duration) / 1e9);
  }
  if (r->decision->source == Source::kPeer && r->release_source) {
    // The copy was a move: the old replica goes (the scheduler may not have dropped it itself:
    // a function whose every block is state keeps one replica, full or not).
    const GpuId source{r->decision->source_gpu};
    if (r->drop_source_from_view) scheduler_->drop_replica(source.value(), r->slot);
    if (const std::optional<InstanceId> instance = state_->instance(r->slot)) {
      actuator_.forget(*instance, source);
    }
    reserve_changed(source);
  }
}

void NodeCore::released(RequestId id, const Status& status, Time now) {
  State::Request* r = state_->request(id);
  if (r == nullptr || r->phase == Phase::kEnded || r->phase == Phase::kQueued) return;
  const GpuId gpu{r->decision->gpu};
  if (r->swap_in_flight) {
    r->swap_in_flight = false;
    (void)scheduler_->load_done(id, now, false);
  }
  if (r->start_error.ok() && r->phase == Phase::kPlacing) {
    r->start_error =
        status.ok() ? error(ErrorCode::kUnknown, "the lease ended before it started") : status;
  }
  answer_start(id, now);
  scheduler::Completion completion;
  completion.failed = r->failed || !status.ok();
  (void)scheduler_->done(id, now, completion);
  State::Gpu& g = state_->gpus[index_of(gpu)];
  state_->clear_runner(g, id);
  if (State::Slot* slot = state_->slot(r->slot)) {
    if (slot->lease == id) slot->lease.reset();
    if (slot->instance) {
      // The scheduler learns the model's real size once a run has shown it.
      learn_model_bytes(r->slot);
      if (!g.healthy || g.drained) {
        scheduler_->drop_replica(gpu.value(), r->slot);
        if (g.healthy) {
          evict(r->slot, gpu, EvictionReason::kDrain);
        } else {
          actuator_.forget(*slot->instance, gpu);
        }
      }
    }
  }
  if (r->background || r->done_said) {
    state_->requests.erase(id);
  } else {
    r->phase = Phase::kEnded;
  }
  reserve_changed(gpu);
}

Status NodeCore::make_room(InstanceId instance, GpuId gpu, uint64_t bytes, Time now) {
  auto found = state_->slot_of.find(instance);
  if (gpu.value() < 0 || gpu.value() >= gpu_count() || found == state_->slot_of.end()) {
    return error(ErrorCode::kOutOfMemory, "no room on GPU ", gpu);
  }
  const FunctionId slot = found->second;
  // The view must first see what the pool holds; then the policy is asked for more room than
  // the view believes free, so that it evicts at least this block's worth. (Evicting the region
  // the pool names as cheapest instead frees exactly the missing run, but bypasses the policy:
  // the view then never fills up, the one-replica and heaviness rules never act, and
  // compliance collapses under load.)
  update_reserved(gpu);
  const uint64_t target = scheduler_->node().free_bytes(gpu.value()) + bytes;
  std::vector<scheduler::Eviction> victims;
  if (!scheduler_->make_room(gpu.value(), target, slot, now, &victims) || victims.empty()) {
    return error(ErrorCode::kOutOfMemory, "GPU ", gpu, " has no room for ", bytes,
                 " more bytes: everything there is in use or protected");
  }
  VLOG(1) << "t=" << now << " GPU " << gpu << " refused " << bytes << " bytes for instance "
          << instance << " of '" << state_->name(slot) << "': make_room evicts " << victims.size();
  for (const scheduler::Eviction& v : victims) {
    evict(v.function, GpuId{v.gpu}, EvictionReason::kMemory);
  }
  return Status();
}

void NodeCore::memory_changed(GpuId gpu) { reserve_changed(gpu); }

void NodeCore::learn_model_bytes(FunctionId slot) {
  const std::optional<InstanceId> instance = state_->instance(slot);
  if (!instance) return;
  const uint64_t model = std::max<uint64_t>(actuator_.model_bytes(*instance), 1);
  const scheduler::FunctionTable& table = scheduler_->functions();
  const std::optional<scheduler::FunctionIndex> index = table.find(slot);
  if (!index || model == table.spec(*index).model_bytes) return;
  // A size no GPU can hold is refused, and the view keeps the old one: the placement then
  // fails in the actuator, which reports it.
  (void)scheduler_->set_model_bytes(slot, model);
}

void NodeCore::fail_gpu(GpuId gpu, const Status& why) {
  State::Gpu& g = state_->gpus[index_of(gpu)];
  if (!g.healthy) return;
  LOG(ERROR) << "GPU " << gpu << " failed (" << why << "): it takes no more requests; its "
             << "models will be brought back from their host copies elsewhere";
  g.healthy = false;
  scheduler_->set_gpu_healthy(gpu.value(), false);
  const std::vector<RequestId> runners = State::runners(g);
  std::vector<FunctionId> running;
  for (RequestId id : runners) running.push_back(state_->requests.at(id).slot);
  for (auto& [id, slot] : state_->slots) {
    if (slot.instance && std::find(running.begin(), running.end(), id) == running.end())
      actuator_.forget(*slot.instance, gpu);
  }
  for (RequestId id : runners) {
    State::Request* r = state_->request(id);
    if (r == nullptr) continue;  // an earlier end() released it at once
    r->failed = true;
    if (r->instance) actuator_.end(id, *r->instance, why);
  }
}

Status NodeCore::hold_gpu(GpuId gpu, bool hold) {
  if (gpu.value() < 0 || gpu.value() >= gpu_count()) {
    return error(ErrorCode::kInvalidDevice, "hold_gpu: no GPU ", gpu);
  }
  scheduler_->set_gpu_held(gpu.value(), hold);
  return Status();
}

// ---- Operators ----

Status NodeCore::drain(std::optional<GpuId> gpu, bool resume) {
  if (gpu && (gpu->value() < 0 || gpu->value() >= gpu_count())) {
    return error(ErrorCode::kInvalidDevice, "drain: no GPU ", *gpu);
  }
  if (!gpu) {
    state_->draining = !resume;
    if (!resume) state_->drains.push_back(std::nullopt);
    return Status();
  }
  State::Gpu& g = state_->gpus[index_of(*gpu)];
  if (resume) {
    g.drained = false;
    if (g.healthy) scheduler_->set_gpu_healthy(gpu->value(), true);
    return Status();
  }
  g.drained = true;
  scheduler_->set_gpu_healthy(gpu->value(), false);
  // Its models leave (the scheduler's view already forgot them); the running one leaves when
  // its request is done.
  std::vector<FunctionId> running;
  for (RequestId id : State::runners(g)) running.push_back(state_->requests.at(id).slot);
  std::vector<FunctionId> resident;
  for (const auto& [id, slot] : state_->slots) {
    if (slot.instance && std::find(running.begin(), running.end(), id) == running.end())
      resident.push_back(id);
  }
  std::sort(resident.begin(), resident.end());
  for (FunctionId id : resident) evict(id, *gpu, EvictionReason::kDrain);
  state_->drains.push_back(gpu);
  return Status();
}

// ---- Decisions ----

void NodeCore::dispatch(Time now) {
  preempt(now);
  // A start can fail at once and free its GPU again, so ask until nothing more starts.
  while (true) {
    refresh_reserves();
    decisions_.clear();
    rejected_.clear();
    scheduler_->dispatch(now, &decisions_, &rejected_);
    if (decisions_.empty() && rejected_.empty()) break;
    // Neither start_one() nor reject() dispatches, so the lists stay as they are while we walk
    // them.
    for (RequestId rid : rejected_) reject(rid, now);
    for (const Decision& d : decisions_) start_one(d, now);
  }
  prewarm(now);
  check_drains();
}

void NodeCore::prewarm(Time now) {
  if (options_.scheduler.prewarm == scheduler::PrewarmRule::kNone || state_->draining) return;
  refresh_reserves();
  decisions_.clear();
  scheduler_->prewarm(now, &decisions_);
  for (const Decision& d : decisions_) {
    // A background request of nobody: it loads the model and ends (Actuator::start).
    State::Request r{.slot = d.function, .background = true, .arrival = now};
    r.instance = state_->instance(d.function);
    state_->requests.emplace(d.request, std::move(r));
    start_one(d, now);
  }
}

void NodeCore::reject(RequestId id, Time now) {
  State::Request& r = state_->requests.at(id);
  r.phase = Phase::kEnded;
  r.failed = true;
  r.start_error = error(ErrorCode::kDeviceUnavailable, "overloaded: request ", id, " of function '",
                        state_->name(r.slot), "' cannot meet its deadline");
  answer_start(id, now);
  // Last: the actuator may say done() at once, which forgets the request.
  if (r.instance) {
    actuator_.rejected(id, *r.instance, r.start_error);
  }
}

void NodeCore::start_one(const Decision& d, Time now) {
  const RequestId rid = d.request;
  State::Request& r = state_->requests.at(rid);
  State::Slot* slot = state_->slot(r.slot);
  const GpuId gpu{d.gpu};
  if (d.rule == scheduler::PlacementRule::kShared) {
    state_->gpus[d.gpu].sharing.push_back(rid);
  } else {
    state_->gpus[d.gpu].running = rid;
  }
  for (const scheduler::Eviction& v : d.evictions) {
    evict(v.function, GpuId{v.gpu}, EvictionReason::kPlacement);
  }
  r.decision = d;
  r.phase = Phase::kPlacing;
  r.placed = now;
  if (slot == nullptr || !slot->instance) {
    // The instance went away after the request queued.
    r.start_error = error(ErrorCode::kDeinitialized, "the function's instance is gone");
    answer_start(rid, now);
    (void)scheduler_->cancel(d.request, now);
    state_->clear_runner(state_->gpus[d.gpu], rid);
    state_->requests.erase(rid);
    return;
  }
  const State::Function& f = state_->functions.at(slot->function);
  Start start{.request = rid, .instance = *slot->instance, .function = slot->function, .gpu = gpu};
  start.source = d.source;
  if (d.source == Source::kPeer) start.source_gpu = GpuId{d.source_gpu};
  start.background = r.background;
  start.prewarm = d.prewarm;
  start.first_request = !r.background && !slot->model_fixed;
  start.rule = d.rule;
  // A function whose every block is state keeps a single replica: copies of it are moves.
  const bool all_state = f.spec.stateful || !slot->model_fixed;
  if (!r.background) slot->model_fixed = true;
  r.release_source = d.source == Source::kPeer && (d.release_source || all_state);
  r.drop_source_from_view = r.release_source && !d.release_source;
  start.release_source = r.release_source;
  r.swap_in_flight = d.source != Source::kResident;
  slot->lease = rid;
  if (r.background) {
    slot->background_queued.reset();
  } else if (slot->background_queued) {
    // The instance's work runs under this request; the background one it asked for is moot.
    (void)scheduler_->cancel(*slot->background_queued, now);
    state_->requests.erase(*slot->background_queued);
    slot->background_queued.reset();
  }
  actuator_.start(start);
}

void NodeCore::preempt(Time now) {
  if (options_.lease_slice <= 0) return;
  // Requests waiting for a GPU, less the GPUs already on their way back.
  int64_t wanted = 0;
  for (const auto& [id, r] : state_->requests) {
    if (r.phase == Phase::kQueued) ++wanted;
    if (r.phase == Phase::kEnding) --wanted;
  }
  if (wanted <= 0) return;
  // Background requests past their slice, whose GPU someone else waits for; longest held first.
  std::vector<std::pair<Time, RequestId>> candidates;
  for (const State::Gpu& g : state_->gpus) {
    if (!g.running) continue;
    const State::Request& r = state_->requests.at(*g.running);
    if (!r.background || r.phase != Phase::kRunning || now - r.placed < options_.lease_slice) {
      continue;
    }
    const bool others_wait =
        std::any_of(state_->requests.begin(), state_->requests.end(), [&](const auto& entry) {
          return entry.second.phase == Phase::kQueued && entry.second.slot != r.slot;
        });
    if (others_wait) candidates.emplace_back(r.placed, *g.running);
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [placed, id] : candidates) {
    if (wanted-- <= 0) break;
    State::Request& r = state_->requests.at(id);
    VLOG(1) << "t=" << now << " preempting background request " << id << " of '"
            << state_->name(r.slot) << "' on GPU " << r.decision->gpu << " after "
            << (now - placed) / 1'000'000 << " ms: others wait";
    r.phase = Phase::kEnding;
    ++state_->preemptions;
    if (r.instance) actuator_.end(id, *r.instance, Status());
  }
}

Time NodeCore::slice_end() const {
  if (options_.lease_slice <= 0) return scheduler::Scheduler::kNever;
  bool waiting = false;
  for (const auto& [id, r] : state_->requests) waiting |= r.phase == Phase::kQueued;
  if (!waiting) return scheduler::Scheduler::kNever;
  Time earliest = scheduler::Scheduler::kNever;
  for (const State::Gpu& g : state_->gpus) {
    if (!g.running) continue;
    const State::Request& r = state_->requests.at(*g.running);
    if (r.background && r.phase == Phase::kRunning) {
      earliest = std::min(earliest, r.placed + options_.lease_slice);
    }
  }
  return earliest;
}

void NodeCore::evict(FunctionId slot, GpuId gpu, EvictionReason reason) {
  const std::optional<InstanceId> instance = state_->instance(slot);
  if (!instance) return;
  Result<uint64_t> freed = actuator_.evict(*instance, gpu);
  if (!freed.ok()) {
    LOG(ERROR) << "evicting instance " << *instance << " of '" << state_->name(slot)
               << "' from GPU " << gpu << ": " << freed.status();
    // A copy that failed is the GPU's fault; anything else is ours, and the GPU is fine.
    if (freed.status().code() != ErrorCode::kIllegalState) {
      fail_gpu(gpu, freed.status().with_context("writing a model back"));
    }
    return;
  }
  if (*freed > 0) {
    State::Gpu& g = state_->gpus[index_of(gpu)];
    ++g.evictions;
    ++g.evictions_by_reason[static_cast<size_t>(reason)];
  }
  reserve_changed(gpu);
}

void NodeCore::reserve_changed(GpuId gpu) {
  state_->stale_reserves |= scheduler::gpu_bit(gpu.value());
}

void NodeCore::refresh_reserves() {
  for (scheduler::GpuMask stale = state_->stale_reserves; stale != 0; stale &= stale - 1) {
    update_reserved(GpuId{__builtin_ctzll(stale)});
  }
}

void NodeCore::update_reserved(GpuId gpu) {
  state_->stale_reserves &= ~scheduler::gpu_bit(gpu.value());
  // Reserved = outside the pool + what the pool gave out that is not a model replica the view
  // holds. A replica counts for what of it is placed: a model still being placed (or one the
  // view sizes larger than its blocks) does not make the reserve negative.
  const int g = index_of(gpu);
  const scheduler::NodeState& view = scheduler_->node();
  const scheduler::FunctionTable& functions = scheduler_->functions();
  uint64_t models = 0;
  for (const scheduler::Replica& replica : view.gpu(g).replicas) {
    const std::optional<InstanceId> instance = state_->instance(functions.id(replica.function));
    if (instance) models += std::min(replica.bytes, actuator_.placed_bytes(*instance, gpu));
  }
  const uint64_t allocated = actuator_.pool_allocated(gpu);
  const uint64_t outside = options_.outside_pool_bytes.empty() ? 0 : options_.outside_pool_bytes[g];
  const uint64_t reserved = outside + (allocated > models ? allocated - models : 0);
  State::Gpu& state = state_->gpus[g];
  if (reserved == state.reported_reserved) return;
  state.reported_reserved = reserved;
  scheduler_->set_reserved(g, reserved);
}

void NodeCore::answer_start(RequestId id, Time now) {
  State::Request& r = state_->requests.at(id);
  if (!r.awaited) return;
  r.awaited = false;
  if (!r.start_error.ok() || !r.decision) {
    actuator_.answer_start(id, r.start_error.ok() ? error(ErrorCode::kIllegalState, "request ", id,
                                                          " has not been placed")
                                                  : r.start_error);
    return;
  }
  StartInfo info{.gpu = GpuId{r.decision->gpu}};
  info.source = r.decision->source;
  if (r.decision->source == Source::kPeer) info.source_gpu = GpuId{r.decision->source_gpu};
  info.rule = r.decision->rule;
  info.queued = now - r.arrival;
  actuator_.answer_start(id, info);
}

void NodeCore::check_drains() {
  auto& drains = state_->drains;
  for (auto it = drains.begin(); it != drains.end();) {
    bool busy = false;
    if (!*it) {
      for (const auto& [id, r] : state_->requests)
        busy |= !r.background && r.phase != Phase::kEnded;
    } else {
      busy = state_->gpus[index_of(**it)].running.has_value();  // sharing only beside it
    }
    if (busy) {
      ++it;
      continue;
    }
    const std::optional<GpuId> target = *it;
    it = drains.erase(it);
    actuator_.drained(target);
  }
}

Time NodeCore::next_wakeup() const { return std::min(scheduler_->next_wakeup(), slice_end()); }

// ---- Views ----

std::optional<Phase> NodeCore::phase(RequestId id) const {
  auto it = state_->requests.find(id);
  if (it == state_->requests.end()) return std::nullopt;
  return it->second.phase;
}

std::optional<RequestId> NodeCore::running(GpuId gpu) const {
  return state_->gpus[index_of(gpu)].running;
}

NodeStatus NodeCore::status(Time now) const {
  NodeStatus out;
  for (const State::Gpu& g : state_->gpus) {
    NodeStatus::Gpu gpu;
    gpu.healthy = g.healthy;
    gpu.drained = g.drained;
    if (g.running) gpu.running = state_->requests.at(*g.running).instance;
    for (RequestId id : g.sharing) {
      if (const std::optional<InstanceId> instance = state_->requests.at(id).instance) {
        gpu.sharing.push_back(*instance);
      }
    }
    gpu.swaps_in = g.swaps_in;
    gpu.swap_in_bytes = g.swap_in_bytes;
    gpu.swap_in_seconds = g.swap_in_seconds;
    gpu.evictions = g.evictions;
    gpu.evictions_by_reason = g.evictions_by_reason;
    out.gpus.push_back(gpu);
  }
  const scheduler::FunctionTable& table = scheduler_->functions();
  for (const auto& [id, f] : state_->functions) {
    NodeStatus::Function fs{.id = id};
    fs.name = f.spec.name;
    fs.stateful = f.spec.stateful;
    scheduler::GpuMask holders = 0;
    for (FunctionId slot_id : f.slots) {
      if (const std::optional<InstanceId> instance = state_->instance(slot_id)) {
        fs.instances.push_back(*instance);
        out.instances.emplace_back(*instance, id);
      }
      const std::optional<scheduler::FunctionIndex> index = table.find(slot_id);
      if (!index) continue;
      fs.heavy = fs.heavy || table.heavy(*index);
      fs.requests += table.stats(*index).requests;
      fs.on_time += table.stats(*index).window.totals(now).on_time;
      fs.rrc = std::max(fs.rrc, scheduler_->rrc(slot_id, now));
      holders |= scheduler_->node().holders(*index);
    }
    std::sort(fs.instances.begin(), fs.instances.end());
    for (int g = 0; g < gpu_count(); ++g) {
      if (holders & scheduler::gpu_bit(g)) fs.resident_gpus.push_back(GpuId{g});
    }
    out.functions.push_back(std::move(fs));
  }
  std::sort(out.functions.begin(), out.functions.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  std::sort(out.instances.begin(), out.instances.end());
  out.queued = scheduler_->queued();
  out.counters = scheduler_->counters();
  out.draining = state_->draining;
  out.swaps_by_link = state_->swaps_by_link;
  out.swap_seconds = state_->swap_seconds;
  out.preemptions = state_->preemptions;
  return out;
}

}  // namespace hiber::node
