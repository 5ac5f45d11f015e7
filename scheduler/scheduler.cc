#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "scheduler/policy_factory.h"

namespace hiber::scheduler {
namespace {

// One accepted request. A slot is reused once its request finishes; its generation tells the
// ids apart.
struct RequestSlot {
  uint32_t generation = 0;  // of the last id issued from this slot; 0: never issued
  bool live = false;
  RequestState state = RequestState::kFinished;
  FunctionIndex function{0};  // meaningful while live
  Time arrival = 0;
  Time deadline = 0;
  Time dispatched = 0;
  uint64_t arrival_index = 0;
  int gpu = -1;
  Source source = Source::kResident;
  int source_gpu = -1;
  bool release_source = false;
  bool pinned = false;      // holds a pin on its peer source replica
  bool background = false;  // not a request of the function's callers (see arrive())
  // Spatial sharing's prediction while it executes: execution left (in time alone) as of
  // progress_at; GPU-sharing re-times it whenever a request joins or leaves its GPU.
  Duration work_left = 0;
  Time progress_at = 0;
  // prewarm(): its replica keeps the function's last use, so that a load for nobody does not
  // make the model look recently used to the eviction policy.
  bool prewarm = false;
};

uint32_t slot_of(RequestId id) { return static_cast<uint32_t>(id.value()); }
uint32_t generation_of(RequestId id) { return static_cast<uint32_t>(id.value() >> 32); }
RequestId make_id(uint32_t slot, uint32_t generation) {
  return RequestId{(uint64_t{generation} << 32) | slot};
}

Status validate(const SchedulerOptions& options) {
  if (options.sharing != "off" && options.sharing != "usher")
    return error(ErrorCode::kInvalidValue, "scheduler: unknown sharing '", options.sharing,
                 "' (known: off, usher)");
  if (options.max_runners_per_gpu < 1)
    return error(ErrorCode::kInvalidValue, "scheduler: max_runners_per_gpu ",
                 options.max_runners_per_gpu, " is below 1");
  if (options.per_function_concurrency < 1)
    return error(ErrorCode::kInvalidValue, "scheduler: per_function_concurrency ",
                 options.per_function_concurrency, " is below 1");
  if (options.window.length <= 0 || options.window.buckets < 1 ||
      options.window.length < options.window.buckets)
    return error(ErrorCode::kInvalidValue, "scheduler: window of ", options.window.length,
                 " ns in ", options.window.buckets, " buckets (needs length >= buckets >= 1)");
  const HeavinessOptions& h = options.heaviness;
  if (!(h.heavy_ratio > 0 && std::isfinite(h.heavy_ratio)))
    return error(ErrorCode::kInvalidValue, "scheduler: heavy_ratio ", h.heavy_ratio,
                 " is not a finite number > 0");
  if (!(h.ewma_alpha > 0 && h.ewma_alpha <= 1))
    return error(ErrorCode::kInvalidValue, "scheduler: ewma_alpha ", h.ewma_alpha,
                 " is not in (0, 1]");
  const EvictionOptions& e = options.eviction_options;
  if (!(e.mcache_b0 > 0 && std::isfinite(e.mcache_b0)))
    return error(ErrorCode::kInvalidValue, "scheduler: mcache_b0 ", e.mcache_b0,
                 " is not a finite number > 0");
  if (e.mcache_refresh < 0)
    return error(ErrorCode::kInvalidValue, "scheduler: mcache_refresh is negative");
  if (e.slack_weight < 0)
    return error(ErrorCode::kInvalidValue, "scheduler: slack_weight is negative");
  if (!(e.slack_power > 0 && std::isfinite(e.slack_power)))
    return error(ErrorCode::kInvalidValue, "scheduler: slack_power ", e.slack_power,
                 " is not a finite number > 0");
  HIBER_RETURN_IF_ERROR(validate(options.prewarm_options));
  return validate(options.queue_options);
}

// The host bandwidth swap estimates assume: the slowest PCIe switch, so estimates err long.
double slowest_host_gbps(const Topology& topology) {
  double gbps = 0;
  for (int g = 0; g < topology.gpu_count(); ++g) {
    const double h = topology.host_to_device_gbps(g);
    if (h > 0 && (gbps == 0 || h < gbps)) gbps = h;
  }
  return gbps;
}

}  // namespace

struct Scheduler::Impl {
  Impl(const Topology& t, const SchedulerOptions& o, const FutureOracle* future,
       std::unique_ptr<PlacementPolicy> placement_policy,
       std::unique_ptr<EvictionPolicy> eviction_policy, std::unique_ptr<QueuePolicy> queue_policy)
      : topology(t),
        options(o),
        oracle(future),
        rng(o.seed),
        node(t),
        functions(o.window, o.heaviness, slowest_host_gbps(t)),
        histograms(o.prewarm_options),
        placement(std::move(placement_policy)),
        evictor(std::move(eviction_policy), o.eviction_options),
        queue(std::move(queue_policy)),
        started(static_cast<size_t>(t.gpu_count()), 0),
        share_gpus(o.sharing != "off") {}

  // ---- Time and contexts ----
  // Time never goes backwards: a smaller `now` is taken as the latest seen (types.h).
  Time advance(Time now) {
    if (!clock_started || now > last_now) last_now = now;
    clock_started = true;
    return last_now;
  }
  QueueContext queue_context() const { return QueueContext{last_now, node, functions, started}; }
  EvictionContext eviction_context(uint64_t arrival_index) {
    return EvictionContext{last_now, node, functions, rng, oracle, arrival_index};
  }
  bool valid_gpu(int g) const { return g >= 0 && g < topology.gpu_count(); }

  // ---- The request table ----
  RequestSlot* find(RequestId id) {
    const uint32_t slot = slot_of(id);
    if (slot >= slots.size()) return nullptr;
    RequestSlot& r = slots[slot];
    return r.live && r.generation == generation_of(id) ? &r : nullptr;
  }
  const RequestSlot* find(RequestId id) const { return const_cast<Impl*>(this)->find(id); }

  Result<RequestId> acquire_slot() {
    uint32_t slot;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else {
      if (slots.size() >= UINT32_MAX)
        return error(ErrorCode::kOutOfMemory, "scheduler: 2^32 requests in flight");
      slot = static_cast<uint32_t>(slots.size());
      slots.emplace_back();
    }
    RequestSlot& r = slots[slot];
    if (++r.generation == 0) r.generation = 1;  // ids are never 0
    r.live = true;
    return make_id(slot, r.generation);
  }

  void release_slot(RequestId id) {
    RequestSlot& r = slots[slot_of(id)];
    r = RequestSlot{.generation = r.generation};
    free_slots.push_back(slot_of(id));
  }

  // ---- Decisions ----
  // Starts the candidate if a GPU it may take can hold its model (after evictions). Retries
  // placement without a GPU where eviction cannot make room.
  bool start(const QueueCandidate& c, std::vector<Decision>* out) {
    RequestSlot& r = slots[slot_of(c.request)];
    const FunctionIndex f = c.function;
    const uint64_t bytes = functions.spec(f).model_bytes;
    const EvictionContext ectx = eviction_context(r.arrival_index);
    GpuMask excluded = ~c.allowed;
    while (true) {
      const Placement p = placement->place(f, PlacementContext{node, functions, rng, excluded});
      if (!p.placed()) return !passed_over && share(c, out);
      victims.clear();
      if (p.source == Source::kResident || evictor.plan(p.gpu, bytes, f, ectx, &victims)) {
        commit(c.request, r, p, ectx, out);
        return true;
      }
      excluded |= gpu_bit(p.gpu);
    }
  }

  // The candidate cannot meet its deadline under the shed rule (SchedulerOptions::shed).
  bool hopeless(const QueueCandidate& c) const {
    const RequestSlot& r = slots[slot_of(c.request)];
    if (options.shed == ShedRule::kNone || r.background) return false;
    Duration least = functions.exec_estimate(c.function);
    // A pipelined swap overlaps the execution, so the swap and the execution each bound the
    // finish from below, and their sum would shed requests that can still make it.
    if (options.shed == ShedRule::kHopeless && node.holders(c.function) == 0)
      least = std::max(least, functions.swap_estimate(c.function));
    return last_now + least > r.deadline;
  }

  // The candidate, already taken from the queue, is answered "overloaded": a miss in its
  // function's window, at once.
  void reject(const QueueCandidate& c, std::vector<RequestId>* rejected) {
    functions.record_completion(c.function, last_now, /*on_time=*/false, /*busy=*/0);
    ++counters.rejected;
    rejected->push_back(c.request);
    release_slot(c.request);
    queue->on_completion(c.function, queue_context());
  }

  // ---- Spatial sharing (SchedulerOptions::sharing) ----
  bool sharing() const { return share_gpus; }
  Intensity intensity(FunctionIndex f) const {
    return functions.spec(f).intensity.value_or(Intensity{});
  }
  // The requests executing on g: the running one, then those sharing it.
  void runners(int g, std::vector<RequestId>* out) const {
    out->clear();
    const GpuState& gpu = node.gpu(g);
    if (gpu.running) out->push_back(*gpu.running);
    for (const CoRunning& c : gpu.sharing) out->push_back(c.request);
  }
  // Busy GPUs a request may join: healthy, running fewer than the limit, none of them loading
  // its model or a background request.
  GpuMask shareable() const {
    if (!sharing()) return 0;
    GpuMask mask = 0;
    for (int g = 0; g < topology.gpu_count(); ++g) {
      const GpuState& gpu = node.gpu(g);
      if (!gpu.running || (node.healthy() & gpu_bit(g)) == 0 ||
          1 + gpu.sharing.size() >= static_cast<size_t>(options.max_runners_per_gpu))
        continue;
      const RequestSlot& r = slots[slot_of(*gpu.running)];
      if (r.state != RequestState::kRunning || r.background) continue;
      mask |= gpu_bit(g);
    }
    return mask;
  }
  // Brings the predicted progress of g's runners up to now, at the slowdown they ran at.
  void settle_progress(int g) {
    runners(g, &scratch_ids);
    scratch_intensities.clear();
    for (RequestId id : scratch_ids)
      scratch_intensities.push_back(intensity(slots[slot_of(id)].function));
    const double slowdown = co_run_slowdown(scratch_intensities);
    for (RequestId id : scratch_ids) {
      RequestSlot& r = slots[slot_of(id)];
      const double done = static_cast<double>(last_now - r.progress_at) / slowdown;
      r.work_left = std::max<Duration>(0, r.work_left - static_cast<Duration>(done));
      r.progress_at = last_now;
    }
  }
  // Starts the candidate beside a running request where its model is complete and the
  // admission rule lets it; of several GPUs the least predicted slowdown, then the lowest.
  bool share(const QueueCandidate& c, std::vector<Decision>* out) {
    const FunctionIndex f = c.function;
    const GpuMask candidates = shareable() & node.holders(f) & c.allowed;
    if (candidates == 0) return false;
    RequestSlot& r = slots[slot_of(c.request)];
    const CoRunner incoming{intensity(f), functions.exec_estimate(f), r.deadline};
    int best = -1;
    double best_slowdown = 0;
    for (GpuMask left = candidates; left != 0; left &= left - 1) {
      const int g = __builtin_ctzll(left);
      settle_progress(g);
      std::vector<CoRunner> running;
      for (RequestId id : scratch_ids) {
        const RequestSlot& other = slots[slot_of(id)];
        running.push_back(CoRunner{intensity(other.function), other.work_left, other.deadline});
      }
      const std::optional<double> slowdown = admit_co_runner(running, incoming, last_now);
      if (slowdown && (best < 0 || *slowdown < best_slowdown)) {
        best = g;
        best_slowdown = *slowdown;
      }
    }
    if (best < 0) return false;
    victims.clear();
    commit(c.request, r, Placement{best, Source::kResident, -1, PlacementRule::kShared},
           eviction_context(r.arrival_index), out);
    return true;
  }

  // Updates the view as if the decision were carried out, and reports it.
  void commit(RequestId id, RequestSlot& r, const Placement& p, const EvictionContext& ectx,
              std::vector<Decision>* out) {
    const Time now = last_now;
    const FunctionIndex f = r.function;
    const int g = p.gpu;
    Decision& d = out->emplace_back(Decision{.request = id,
                                             .function = functions.id(f),
                                             .gpu = g,
                                             .source = p.source,
                                             .source_gpu = p.source_gpu,
                                             .rule = p.rule,
                                             .evictions = victims,
                                             .arrival = r.arrival,
                                             .arrival_index = r.arrival_index});
    drop_victims();
    const uint64_t bytes = functions.spec(f).model_bytes;
    switch (p.source) {
      case Source::kResident:
        node.find(g, f)->last_used = now;
        r.state = RequestState::kRunning;
        r.work_left = functions.exec_estimate(f);
        r.progress_at = now;
        ++counters.resident_starts;
        break;
      case Source::kPeer:
        node.add_replica(g, f, bytes, /*loading=*/true, now);
        ++node.find(p.source_gpu, f)->source_pins;
        r.pinned = true;
        // A move when the target had to evict to fit (§5.4: one replica when full). Only with
        // one request per function at a time: otherwise another request of the function could
        // start on the source replica before the copy completes and lose it under its feet.
        d.release_source = !victims.empty() && options.per_function_concurrency == 1;
        r.state = RequestState::kLoading;
        ++counters.peer_swaps;
        break;
      case Source::kHost:
        node.add_replica(g, f, bytes, /*loading=*/true, now);
        node.set_host_loading(g, f);
        r.state = RequestState::kLoading;
        ++counters.host_swaps;
        break;
    }
    if (p.source != Source::kResident) evictor.policy().on_loaded(f, ectx);
    if (p.rule == PlacementRule::kShared) {
      // Its runners' progress was settled when the rule admitted it.
      node.add_sharing(g, id, f);
      ++counters.shared_starts;
    } else {
      node.set_running(g, id, f);
      started[static_cast<size_t>(g)] = now;
    }
    r.gpu = g;
    r.dispatched = now;
    r.source = p.source;
    r.source_gpu = p.source_gpu;
    r.release_source = d.release_source;
    ++counters.dispatched;
  }

  // This decision's victims (`victims`, cleared before every plan) leave the view. Not the
  // evictor's own list: a resident start runs no plan, and that list would still hold the
  // victims of an earlier one.
  void drop_victims() {
    for (const Eviction& v : victims) {
      if (const std::optional<FunctionIndex> f = functions.find(v.function))
        node.remove_replica(v.gpu, *f);
      ++counters.evictions;
      counters.evicted_bytes += v.bytes;
    }
  }

  // ---- Ends of loads and requests ----
  void unpin(RequestSlot& r) {
    if (!r.pinned) return;
    r.pinned = false;
    Replica* source = node.find(r.source_gpu, r.function);
    if (source != nullptr && source->source_pins > 0) --source->source_pins;
  }

  // The replica (g, f) is leaving the view outside a decision: requests copying from it no
  // longer hold a pin on it.
  void forget_pins(int g, FunctionIndex f) {
    for (int x = 0; x < topology.gpu_count(); ++x) {
      const std::optional<RequestId> id = node.gpu(x).running;
      if (!id) continue;
      RequestSlot& r = slots[slot_of(*id)];
      if (r.pinned && r.source_gpu == g && r.function == f) r.pinned = false;
    }
  }

  void finish_load(RequestSlot& r, bool ok) {
    const FunctionIndex f = r.function;
    const int g = r.gpu;
    unpin(r);
    Replica* replica = node.find(g, f);
    if (ok) {
      if (replica != nullptr) {
        node.mark_complete(g, *replica);
        if (!r.prewarm) replica->last_used = last_now;
      }
      if (r.source == Source::kHost) functions.record_host_swap(f, last_now - r.dispatched);
      if (r.release_source) node.remove_replica(r.source_gpu, f);
      // What is left to execute once the bytes are there; counted whole, so sharing errs safe.
      r.work_left = functions.exec_estimate(f);
      r.progress_at = last_now;
    } else if (replica != nullptr && replica->loading) {
      node.remove_replica(g, f);
    }
    if (r.source == Source::kHost && node.gpu(g).host_loading == f)
      node.set_host_loading(g, std::nullopt);
    r.state = RequestState::kRunning;
  }

  void finish(RequestId id, RequestSlot& r, bool failed, Duration exec) {
    const Time now = last_now;
    const FunctionIndex f = r.function;
    const int g = r.gpu;
    if (r.state == RequestState::kLoading) finish_load(r, /*ok=*/false);
    if (Replica* replica = node.find(g, f); replica != nullptr && !replica->loading && !r.prewarm)
      replica->last_used = now;
    if (sharing()) settle_progress(g);
    node.clear_running(g, id);
    if (!r.background) {
      const bool on_time = !failed && now - r.arrival <= functions.spec(f).slo;
      functions.record_completion(f, now, on_time, now - r.dispatched);
      if (!failed) {
        if (exec >= 0) {
          functions.record_exec(f, exec);
        } else if (r.source == Source::kResident) {
          functions.record_exec(f, now - r.dispatched);
        }
      }
      ++counters.completed;
      if (on_time) ++counters.on_time;
      if (failed) ++counters.failed;
    }
    const uint32_t limit = static_cast<uint32_t>(options.per_function_concurrency);
    const bool was_limited = in_flight[f.value()] >= limit;
    --in_flight[f.value()];
    release_slot(id);
    const QueueContext ctx = queue_context();
    if (was_limited && in_flight[f.value()] < limit) queue->set_eligible(f, true, ctx);
    queue->on_completion(f, ctx);
  }

  Status check_requests() const;

  const Topology& topology;
  SchedulerOptions options;
  const FutureOracle* oracle;
  Rng rng;
  NodeState node;
  FunctionTable functions;
  IdleHistograms histograms;  // fed only under SchedulerOptions::prewarm
  std::unique_ptr<PlacementPolicy> placement;
  Evictor evictor;
  std::unique_ptr<QueuePolicy> queue;

  std::vector<RequestSlot> slots;
  std::vector<uint32_t> free_slots;
  std::vector<uint32_t> in_flight;  // per function index: requests loading or running
  std::vector<Time> started;        // per GPU: dispatch time of the request running there
  const bool share_gpus;            // options.sharing is not "off"
  SchedulerCounters counters;
  bool clock_started = false;
  Time last_now = 0;
  uint64_t next_arrival_index = 0;
  std::vector<Eviction> victims;  // scratch for plans
  // This dispatch round left a request waiting: sharing then starts none behind it, which would
  // keep the GPUs it waits for busy longer (a priority inversion).
  bool passed_over = false;
  std::vector<RequestId> scratch_ids;          // settle_progress(): g's runners
  std::vector<Intensity> scratch_intensities;  // settle_progress()
};

Status Scheduler::Impl::check_requests() const {
  size_t queued = 0;
  std::vector<uint32_t> flight(in_flight.size(), 0);
  std::map<std::pair<int, FunctionIndex>, uint32_t> pins;
  for (uint32_t slot = 0; slot < slots.size(); ++slot) {
    const RequestSlot& r = slots[slot];
    if (!r.live) continue;
    const RequestId id = make_id(slot, r.generation);
    if (!functions.live(r.function))
      return error(ErrorCode::kIllegalState, "request ", id, " belongs to no registered function");
    if (r.state == RequestState::kQueued) {
      ++queued;
      if (!queue->contains(id))
        return error(ErrorCode::kIllegalState, "queued request ", id, " is not in the queue");
      continue;
    }
    if (r.state != RequestState::kLoading && r.state != RequestState::kRunning)
      return error(ErrorCode::kIllegalState, "request ", id, " is live but finished");
    if (queue->contains(id))
      return error(ErrorCode::kIllegalState, "dispatched request ", id, " is still queued");
    const auto shares = [&](const CoRunning& c) { return c.request == id; };
    if (!valid_gpu(r.gpu) ||
        (node.gpu(r.gpu).running != id &&
         std::none_of(node.gpu(r.gpu).sharing.begin(), node.gpu(r.gpu).sharing.end(), shares)))
      return error(ErrorCode::kIllegalState, "dispatched request ", id, " does not hold GPU ",
                   r.gpu);
    ++flight[r.function.value()];
    const GpuState& gpu = node.gpu(r.gpu);
    const bool loading = r.state == RequestState::kLoading;
    const bool host_loading = loading && r.source == Source::kHost;
    if (host_loading != (gpu.host_loading == r.function))
      return error(ErrorCode::kIllegalState, "request ", id, " and GPU ", r.gpu,
                   " disagree on a host load");
    if (r.pinned) {
      if (!loading || r.source != Source::kPeer)
        return error(ErrorCode::kIllegalState, "request ", id, " pins a source it is not copying");
      ++pins[{r.source_gpu, r.function}];
    }
  }
  if (queued != queue->size())
    return error(ErrorCode::kIllegalState, queued, " requests are queued, the queue holds ",
                 queue->size());
  for (FunctionIndex f{0}; f.value() < in_flight.size(); f = FunctionIndex{f.value() + 1}) {
    if (flight[f.value()] != in_flight[f.value()])
      return error(ErrorCode::kIllegalState, "function index ", f, " has ", flight[f.value()],
                   " requests in flight, counted ", in_flight[f.value()]);
    if (in_flight[f.value()] > static_cast<uint32_t>(options.per_function_concurrency))
      return error(ErrorCode::kIllegalState, "function index ", f, " exceeds its concurrency");
  }
  for (int g = 0; g < topology.gpu_count(); ++g) {
    const GpuState& gpu = node.gpu(g);
    if (gpu.running) {
      const RequestSlot* r = find(*gpu.running);
      if (r == nullptr || r->gpu != g || r->function != gpu.running_function)
        return error(ErrorCode::kIllegalState, "GPU ", g, " runs request ", *gpu.running,
                     " which is not dispatched there");
    }
    for (const CoRunning& c : gpu.sharing) {
      const RequestSlot* r = find(c.request);
      if (r == nullptr || r->gpu != g || r->function != c.function ||
          r->state != RequestState::kRunning)
        return error(ErrorCode::kIllegalState, "GPU ", g, " is shared with request ", c.request,
                     " which is not running there");
    }
    for (const Replica& replica : gpu.replicas) {
      if (replica.loading) {
        const RequestSlot* r = gpu.running ? find(*gpu.running) : nullptr;
        if (r == nullptr || r->state != RequestState::kLoading || r->function != replica.function)
          return error(ErrorCode::kIllegalState, "GPU ", g, " loads function index ",
                       replica.function, " for no request");
      }
      auto it = pins.find({g, replica.function});
      const uint32_t expected = it == pins.end() ? 0 : it->second;
      if (replica.source_pins != expected)
        return error(ErrorCode::kIllegalState, "replica of function index ", replica.function,
                     " on GPU ", g, " has ", replica.source_pins, " pins, ", expected,
                     " copies read it");
    }
  }
  return Status();
}

// ---- Scheduler ----

Result<ShedRule> shed_rule_from_name(std::string_view name) {
  if (name == "none") return ShedRule::kNone;
  if (name == "late") return ShedRule::kLate;
  if (name == "hopeless") return ShedRule::kHopeless;
  return error(ErrorCode::kInvalidValue, "unknown shed rule '", name,
               "' (known: none, late, hopeless)");
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const Topology& topology,
                                                     const SchedulerOptions& options,
                                                     const FutureOracle* oracle) {
  HIBER_RETURN_IF_ERROR(validate(options));
  HIBER_ASSIGN_OR_RETURN(std::unique_ptr<PlacementPolicy> placement,
                         make_placement_policy(options.placement));
  HIBER_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> eviction,
                         make_eviction_policy(options.eviction, options.eviction_options, oracle));
  HIBER_ASSIGN_OR_RETURN(std::unique_ptr<QueuePolicy> queue,
                         make_queue_policy(options.queue, options.queue_options));
  auto impl = std::make_unique<Impl>(topology, options, oracle, std::move(placement),
                                     std::move(eviction), std::move(queue));
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(impl)));
}

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Scheduler::~Scheduler() = default;

// ---- Functions ----

Status Scheduler::register_function(FunctionId id, const FunctionSpec& spec, Time now) {
  Impl& s = *impl_;
  now = s.advance(now);
  uint64_t largest = 0;
  for (int g = 0; g < s.topology.gpu_count(); ++g)
    largest = std::max(largest, s.topology.memory_bytes(g));
  if (spec.model_bytes > largest)
    return error(ErrorCode::kInvalidValue, "function ", id, ": a model of ", spec.model_bytes,
                 " bytes fits on no GPU (the largest has ", largest, ")");
  HIBER_ASSIGN_OR_RETURN(const FunctionIndex f, s.functions.add(id, spec, now));
  s.node.ensure_function_slots(s.functions.slots());
  s.in_flight.resize(s.functions.slots(), 0);
  s.histograms.ensure_slots(s.functions.slots());
  s.histograms.forget(f);  // a reused slot starts afresh
  s.queue->add_function(f);
  s.queue->invalidate();
  return Status();
}

Status Scheduler::unregister_function(FunctionId id, Time now, std::vector<RequestId>* cancelled) {
  Impl& s = *impl_;
  s.advance(now);
  const std::optional<FunctionIndex> found = s.functions.find(id);
  if (!found) return error(ErrorCode::kNotFound, "function ", id, " is not registered");
  const FunctionIndex f = *found;
  if (s.in_flight[f.value()] > 0)
    return error(ErrorCode::kIllegalState, "function ", id, " has ", s.in_flight[f.value()],
                 " requests loading or running");
  std::vector<RequestId> ids;
  s.queue->erase_function(f, &ids);
  for (RequestId r : ids) s.release_slot(r);
  s.counters.cancelled += ids.size();
  if (cancelled != nullptr) cancelled->insert(cancelled->end(), ids.begin(), ids.end());
  for (int g = 0; g < s.topology.gpu_count(); ++g) s.node.remove_replica(g, f);
  HIBER_RETURN_IF_ERROR(s.functions.remove(id));
  s.queue->invalidate();
  return Status();
}

Status Scheduler::set_model_bytes(FunctionId id, uint64_t bytes) {
  Impl& s = *impl_;
  const std::optional<FunctionIndex> found = s.functions.find(id);
  if (!found) return error(ErrorCode::kNotFound, "function ", id, " is not registered");
  const FunctionIndex f = *found;
  uint64_t largest = 0;
  for (int g = 0; g < s.topology.gpu_count(); ++g)
    largest = std::max(largest, s.topology.memory_bytes(g));
  if (bytes == 0 || bytes > largest)
    return error(ErrorCode::kInvalidValue, "function ", id, ": model size ", bytes,
                 " is 0 or fits on no GPU (the largest has ", largest, ")");
  s.functions.set_model_bytes(f, bytes);
  for (int g = 0; g < s.topology.gpu_count(); ++g) s.node.set_replica_bytes(g, f, bytes);
  return Status();
}

// ---- Requests ----

Result<RequestId> Scheduler::arrive(FunctionId id, Time now, bool background) {
  Impl& s = *impl_;
  now = s.advance(now);
  const std::optional<FunctionIndex> found = s.functions.find(id);
  if (!found) return error(ErrorCode::kNotFound, "function ", id, " is not registered");
  const FunctionIndex f = *found;
  HIBER_ASSIGN_OR_RETURN(const RequestId request, s.acquire_slot());
  RequestSlot& r = s.slots[slot_of(request)];
  r.state = RequestState::kQueued;
  r.function = f;
  r.arrival = now;
  r.deadline = now + s.functions.spec(f).slo;
  r.arrival_index = s.next_arrival_index++;
  r.background = background;
  if (background) {
    ++s.counters.background;
  } else {
    s.functions.record_arrival(f, now);
    if (s.options.prewarm != PrewarmRule::kNone) s.histograms.record_arrival(f, now);
    ++s.counters.arrivals;
  }
  s.queue->push(QueuedRequest{request, f, r.arrival, r.deadline, r.arrival_index},
                s.queue_context());
  return request;
}

void Scheduler::dispatch(Time now, std::vector<Decision>* out, std::vector<RequestId>* rejected) {
  Impl& s = *impl_;
  s.advance(now);
  // With no GPU free, only sharing can start a request, and only before one was left waiting.
  const auto can_start = [&] {
    return s.node.available() != 0 || (!s.passed_over && s.shareable() != 0);
  };
  s.passed_over = false;
  if (s.queue->size() == 0 || !can_start()) return;
  const QueueContext ctx = s.queue_context();
  const uint32_t limit = static_cast<uint32_t>(s.options.per_function_concurrency);
  s.queue->begin_round(ctx);
  QueueCandidate c;
  while (can_start() && s.queue->next(ctx, &c)) {
    if (rejected != nullptr && s.hopeless(c)) {
      s.queue->take(c, ctx);
      s.reject(c, rejected);
      continue;
    }
    if (!s.start(c, out)) {
      s.passed_over = true;
      s.queue->pass(c, ctx);
      continue;
    }
    // Ineligible first: taking the request then leaves the function out of the heap at once
    // rather than re-keying it there only to take it out again.
    if (++s.in_flight[c.function.value()] >= limit) s.queue->set_eligible(c.function, false, ctx);
    s.queue->take(c, ctx);
  }
  s.queue->end_round(ctx);
}

void Scheduler::prewarm(Time now, std::vector<Decision>* out) {
  Impl& s = *impl_;
  s.advance(now);
  if (s.options.prewarm == PrewarmRule::kNone || s.queue->size() != 0) return;
  const uint32_t limit = static_cast<uint32_t>(s.options.per_function_concurrency);
  while (std::optional<PrewarmPlan> plan =
             plan_prewarm(s.node, s.functions, s.histograms, s.in_flight, s.options.prewarm_options,
                          s.last_now)) {
    Result<RequestId> id = s.acquire_slot();
    if (!id.ok()) return;
    RequestSlot& r = s.slots[slot_of(*id)];
    const FunctionIndex f = plan->function;
    s.histograms.record_prewarm(f);
    r.state = RequestState::kQueued;
    r.function = f;
    r.arrival = s.last_now;
    r.deadline = s.last_now + s.functions.spec(f).slo;
    r.arrival_index = s.next_arrival_index++;
    r.background = true;
    ++s.counters.background;
    ++s.counters.prewarms;
    s.counters.prewarm_evictions += plan->evictions.size();
    s.victims = std::move(plan->evictions);
    const Placement p{.gpu = plan->gpu, .source = Source::kHost, .rule = PlacementRule::kHostAny};
    s.commit(*id, r, p, s.eviction_context(r.arrival_index), out);
    out->back().prewarm = true;
    r.prewarm = true;
    s.node.find(plan->gpu, f)->last_used = s.functions.stats(f).last_arrival;
    if (++s.in_flight[f.value()] >= limit) s.queue->set_eligible(f, false, s.queue_context());
  }
}

Status Scheduler::load_done(RequestId request, Time now, bool ok) {
  Impl& s = *impl_;
  s.advance(now);
  RequestSlot* r = s.find(request);
  if (r == nullptr || r->state != RequestState::kLoading)
    return error(ErrorCode::kNotFound, "request ", request, " is not loading a model");
  s.finish_load(*r, ok);
  return Status();
}

Status Scheduler::done(RequestId request, Time now, const Completion& completion) {
  Impl& s = *impl_;
  s.advance(now);
  RequestSlot* r = s.find(request);
  if (r == nullptr || (r->state != RequestState::kLoading && r->state != RequestState::kRunning))
    return error(ErrorCode::kNotFound, "request ", request, " is not dispatched");
  s.finish(request, *r, completion.failed, completion.exec);
  return Status();
}

Status Scheduler::cancel(RequestId request, Time now) {
  Impl& s = *impl_;
  s.advance(now);
  RequestSlot* r = s.find(request);
  if (r == nullptr) return error(ErrorCode::kNotFound, "request ", request, " is not pending");
  ++s.counters.cancelled;
  if (r->state == RequestState::kQueued) {
    s.queue->erase(request, s.queue_context());
    s.release_slot(request);
    return Status();
  }
  s.finish(request, *r, /*failed=*/true, /*exec=*/-1);
  return Status();
}

// ---- Memory and GPUs ----

void Scheduler::set_reserved(int gpu, uint64_t bytes) {
  if (impl_->valid_gpu(gpu)) impl_->node.set_reserved(gpu, bytes);
}

bool Scheduler::make_room(int gpu, uint64_t bytes, FunctionId keep, Time now,
                          std::vector<Eviction>* out) {
  Impl& s = *impl_;
  s.advance(now);
  if (!s.valid_gpu(gpu)) return false;
  // The oracle counts from the request the room is for: the one running there, else the latest.
  uint64_t arrival_index = s.next_arrival_index > 0 ? s.next_arrival_index - 1 : 0;
  if (const RequestSlot* r = s.node.gpu(gpu).running ? s.find(*s.node.gpu(gpu).running) : nullptr)
    arrival_index = r->arrival_index;
  s.victims.clear();
  if (!s.evictor.plan(gpu, bytes, s.functions.find(keep), s.eviction_context(arrival_index),
                      &s.victims))
    return false;
  s.drop_victims();
  out->insert(out->end(), s.victims.begin(), s.victims.end());
  return true;
}

void Scheduler::drop_replica(int gpu, FunctionId id) {
  Impl& s = *impl_;
  const std::optional<FunctionIndex> found = s.functions.find(id);
  if (!s.valid_gpu(gpu) || !found) return;
  const FunctionIndex f = *found;
  s.forget_pins(gpu, f);
  s.node.remove_replica(gpu, f);
}

void Scheduler::set_gpu_healthy(int gpu, bool healthy) {
  Impl& s = *impl_;
  if (!s.valid_gpu(gpu) || ((s.node.healthy() & gpu_bit(gpu)) != 0) == healthy) return;
  s.node.set_healthy(gpu, healthy);
  if (!healthy) {
    while (!s.node.gpu(gpu).replicas.empty()) {
      const FunctionIndex f = s.node.gpu(gpu).replicas.back().function;
      s.forget_pins(gpu, f);
      s.node.remove_replica(gpu, f);
    }
  }
  s.queue->invalidate();
}

void Scheduler::set_gpu_held(int gpu, bool held) {
  Impl& s = *impl_;
  if (!s.valid_gpu(gpu)) return;
  s.node.set_held(gpu, held);
  s.queue->invalidate();
}

// ---- Views ----

Time Scheduler::next_wakeup() const {
  const Impl& s = *impl_;
  // With no GPU free nothing can start before an event frees one.
  if (s.node.available() == 0) return kNever;
  if (s.queue->size() != 0) return s.queue->next_wakeup();
  // An idle node: the next prewarm that falls due (prewarm()).
  if (s.options.prewarm == PrewarmRule::kNone) return kNever;
  const Time due = next_prewarm_due(s.node, s.functions, s.histograms, s.in_flight, s.last_now);
  return due == kNotExpected ? kNever : due;
}

Result<RequestInfo> Scheduler::request(RequestId request) const {
  const Impl& s = *impl_;
  const uint32_t slot = slot_of(request);
  const uint32_t generation = generation_of(request);
  if (const RequestSlot* r = s.find(request)) {
    return RequestInfo{
        s.functions.id(r->function), r->state, r->gpu, r->arrival, r->deadline, r->dispatched};
  }
  // Issued from this slot before its current generation: it has finished (or was cancelled).
  if (slot < s.slots.size() && generation != 0 && generation <= s.slots[slot].generation)
    return RequestInfo{.function = std::nullopt};
  return error(ErrorCode::kNotFound, "request ", request, " was never issued");
}

size_t Scheduler::queued() const { return impl_->queue->size(); }
const NodeState& Scheduler::node() const { return impl_->node; }
const FunctionTable& Scheduler::functions() const { return impl_->functions; }
const SchedulerCounters& Scheduler::counters() const { return impl_->counters; }

double Scheduler::rrc(FunctionId id, Time now) const {
  const std::optional<FunctionIndex> f = impl_->functions.find(id);
  return f ? function_rrc(impl_->functions, *f, now) : 0.0;
}

Status Scheduler::check_invariants() const {
  const Impl& s = *impl_;
  HIBER_RETURN_IF_ERROR(s.node.check_invariants());
  HIBER_RETURN_IF_ERROR(s.queue->check_invariants());
  return s.check_requests();
}

}  // namespace hiber::scheduler
