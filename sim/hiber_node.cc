#include "sim/hiber_node.h"

#include <algorithm>

#include <glog/logging.h>

namespace hiber::sim {

using scheduler::Source;

HiberNode::HiberNode(const HiberOptions& options, EventQueue* queue, Recorder* recorder,
                     int node_index)
    : options_(options), queue_(queue), recorder_(recorder), node_index_(node_index) {}

HiberNode::~HiberNode() = default;

Result<std::unique_ptr<HiberNode>> HiberNode::create(const NodeConfig& config,
                                                     const HiberOptions& options, EventQueue* queue,
                                                     Recorder* recorder, int node_index,
                                                     const scheduler::FutureOracle* oracle) {
  std::unique_ptr<HiberNode> node(new HiberNode(options, queue, recorder, node_index));
  HIBER_ASSIGN_OR_RETURN(scheduler::Topology topology, scheduler::Topology::from_config(config));
  node->topology_ = std::make_unique<scheduler::Topology>(std::move(topology));
  const scheduler::Topology& topo = *node->topology_;
  const int gpus = topo.gpu_count();
  const uint64_t granularity = 2 * kMiB;
  std::vector<uint64_t> budgets;
  for (int g = 0; g < gpus; ++g) {
    const uint64_t memory = topo.memory_bytes(g);
    if (memory <= options.gpu_reserve_bytes + granularity)
      return error(ErrorCode::kInvalidValue, "GPU ", g, " has ", memory >> 20,
                   " MiB, not more than the ", options.gpu_reserve_bytes >> 20, " MiB reserve");
    budgets.push_back((memory - options.gpu_reserve_bytes) / granularity * granularity);
  }
  if (options.pool == memory::PoolKind::kBuddy) {
    if (options.pool_chunk_bytes < granularity)
      return error(ErrorCode::kInvalidValue, "pool chunks must be at least 2 MiB");
    const uint64_t chunk_max = options.pool_chunk_bytes / granularity * granularity;
    std::vector<std::vector<uint64_t>> chunks(gpus);
    for (int g = 0; g < gpus; ++g) {
      for (uint64_t left = budgets[g]; left > 0;) {
        const uint64_t chunk = std::min(left, chunk_max);
        chunks[g].push_back(chunk);
        left -= chunk;
      }
    }
    HIBER_ASSIGN_OR_RETURN(node->pools_, memory::GpuPools::create_buddy(chunks, options.buddy));
  } else {
    std::vector<memory::ChunkSource*> upstreams;
    for (int g = 0; g < gpus; ++g) {
      node->device_.push_back(
          std::make_unique<TimedChunkSource>(budgets[g], options.device_malloc));
      upstreams.push_back(node->device_.back().get());
    }
    HIBER_ASSIGN_OR_RETURN(node->pools_, memory::GpuPools::create_upstream(options.pool, upstreams,
                                                                           budgets, granularity));
  }
  node->links_ = std::make_unique<LinkModel>(topo, queue, options.links);
  node->models_.resize(gpus);
  node->model_placed_.resize(gpus);
  node->allocated_.assign(gpus, 0);
  node->device_cost_.assign(gpus, 0);
  node->co_run_.assign(gpus, CoRun(options.interference));
  node::NodeOptions core_options;
  core_options.scheduler = options.scheduler;
  core_options.outside_pool_bytes.assign(gpus, options.gpu_reserve_bytes);
  HIBER_ASSIGN_OR_RETURN(node->core_, node::NodeCore::create(topo, core_options, *node, oracle));
  return node;
}

Status HiberNode::add_function(uint32_t index, const SimFunction& function, Time now) {
  if (function.model < 0 || function.model >= static_cast<int>(paper_models().size()))
    return error(ErrorCode::kInvalidValue, "function ", function.name, ": no model ",
                 function.model);
  return add_function(index, function, paper_models()[function.model], now);
}

Status HiberNode::add_function(uint32_t index, const SimFunction& function, const Model& model,
                               Time now) {
  node::FunctionSpec spec;
  spec.name = function.name;
  spec.model_bytes = model.model_bytes;
  spec.slo = function.slo;
  spec.tail_percentile = function.percentile;
  // What a function's author or hiberd's first run would tell: its execution time. The swap
  // time is left to the scheduler's own estimate (bytes over the PCIe bandwidth).
  spec.exec_time_hint = model.exec;
  spec.intensity = model.intensity;
  if (index >= deployed_.size()) {
    deployed_.resize(index + 1);
    for (auto& per_gpu : models_) per_gpu.resize(index + 1);
    for (auto& per_gpu : model_placed_) per_gpu.resize(index + 1, 0);
  }
  deployed_[index] = {&function, &model};
  HIBER_RETURN_IF_ERROR(core_->add_function(id_of(index), spec, now));
  // A simulated function's instance is always there.
  HIBER_RETURN_IF_ERROR(core_->attach(instance_of(index), id_of(index), now));
  if (options_.start_up) {
    now_ = now;
    core_->need_gpu(instance_of(index), now);
    dispatch(now);
  }
  return Status();
}

void HiberNode::arrive(uint32_t index, Time now) {
  now_ = now;
  Result<RequestId> id = core_->arrive(id_of(index), instance_of(index), now);
  CHECK(id.ok()) << "arrival for a function this node does not host: " << id.status();
  Request& r = requests_[*id];
  r.function = index;
  r.arrival = now;
  Deployed& d = deployed_[index];
  r.exec = options_.exec_variation.scale(d.model->exec, d.model->model_class, index, d.arrivals++);
  dispatch(now);
}

void HiberNode::dispatch(Time now) {
  now_ = now;
  core_->dispatch(now);
  schedule_wakeup(now);
  if (options_.check_invariants) check(now);
}

void HiberNode::schedule_wakeup(Time now) {
  const Time next = core_->next_wakeup();
  if (next == scheduler::Scheduler::kNever || next >= wakeup_at_) return;
  wakeup_at_ = std::max(next, now);
  queue_->schedule(wakeup_at_, this, kWakeup, 0);
}

void HiberNode::start(const node::Start& d) {
  const Time now = now_;
  if (d.background) {
    // A start-up: the instance loads its model (HiberOptions::start_up).
    Request& startup = requests_[d.request];
    startup.function = index_of(d.instance);
    startup.arrival = now;
    startup.background = true;
  }
  auto it = requests_.find(d.request);
  CHECK(it != requests_.end()) << "start of an unknown request";
  Request& r = it->second;
  const Model& model = *deployed_[r.function].model;
  const int gpu = d.gpu.value();
  r.gpu = gpu;
  r.dispatched = now;
  r.source = d.source;
  r.source_gpu = d.source_gpu ? d.source_gpu->value() : -1;
  r.started = true;
  VLOG(1) << "t=" << now << " request " << d.request << " of function " << d.function << " on GPU "
          << gpu << " from " << scheduler::source_name(d.source) << " ("
          << scheduler::placement_rule_name(d.rule) << ")";
  bool ok = true;
  if (d.source != Source::kResident) {
    if (!models_[gpu][r.function].empty()) {
      // The scheduler's view lost this replica without an eviction telling us; the pool still
      // holds its blocks. Free them so that pool and view agree again.
      LOG_FIRST_N(WARNING, 5) << "function " << d.function << " is loaded onto GPU " << gpu
                              << " where its blocks still are: the scheduler dropped the replica "
                                 "from its view without naming it";
      ++lost_replicas_;
      free_model(gpu, r.function);
    }
    for (uint64_t segment : model.segments) {
      if (!allocate(gpu, segment, r.function, now, &models_[gpu][r.function], !d.prewarm)) {
        ok = false;
        break;
      }
    }
  }
  for (size_t i = 0; ok && !r.background && i < model.scratch_segments.size(); ++i)
    ok = allocate(gpu, model.scratch_segments[i], r.function, now, &r.scratch);
  core_->memory_changed(d.gpu);
  collect_device_cost(gpu);
  const scheduler::Duration delay = device_cost_[gpu];
  device_cost_[gpu] = 0;
  if (!ok) {
    fail(d.request, r, now);
    return;
  }
  core_->streaming(d.request, Status(), now);
  if (d.source == Source::kResident) {
    if (r.background) {
      r.finish_at = now + delay;
      queue_->schedule(r.finish_at, this, kDone, d.request.value());
    } else {
      execute(d.request, r, delay + r.exec, now);
    }
  } else {
    queue_->schedule(now + delay + options_.pipeline.setup, this, kStartTransfer,
                     d.request.value());
  }
}

bool HiberNode::allocate(int gpu, uint64_t bytes, uint32_t index, Time now, std::vector<Block>* out,
                         bool may_evict) {
  const FunctionId id = id_of(index);
  while (true) {
    // The core picks victims on a refusal, so the pool need not search for its own advice.
    memory::AllocationResult a =
        pools_->allocate(gpu, bytes, id, {}, memory::EvictionAdvice::kSkipped);
    if (a.ok()) {
      out->push_back({*a, bytes});
      allocated_[gpu] += a->bytes;
      if (out == &models_[gpu][index]) model_placed_[gpu][index] += bytes;
      return true;
    }
    ++pool_failures_;
    if (!may_evict) return false;
    // The core's eviction policy picks the victims, as it does for decisions.
    if (!core_->make_room(instance_of(index), GpuId{gpu}, bytes, now).ok()) return false;
  }
}

void HiberNode::free_blocks(int gpu, std::vector<Block>* blocks, bool model, uint32_t index) {
  for (const Block& b : *blocks) {
    const Status s = pools_->deallocate(gpu, b.allocation);
    CHECK(s.ok()) << "freeing a block the pool gave out: " << s;
    allocated_[gpu] -= b.allocation.bytes;
    if (model) model_placed_[gpu][index] -= b.requested;
  }
  blocks->clear();
}

void HiberNode::free_model(int gpu, uint32_t index) {
  free_blocks(gpu, &models_[gpu][index], /*model=*/true, index);
}

void HiberNode::collect_device_cost(int gpu) {
  if (device_.empty()) return;
  device_cost_[gpu] += device_[gpu]->take_cost();
}

// ---- node::Actuator ----

Result<uint64_t> HiberNode::evict(InstanceId instance, GpuId gpu) {
  uint64_t freed = 0;
  for (const Block& b : models_[gpu.value()][index_of(instance)]) freed += b.allocation.bytes;
  free_model(gpu.value(), index_of(instance));
  ++evictions_;
  return freed;
}

void HiberNode::forget(InstanceId instance, GpuId gpu) {
  free_model(gpu.value(), index_of(instance));
}

void HiberNode::end(RequestId id, InstanceId, const Status& failure) {
  // A simulated request's work ends with it (complete() or fail()), which is what led here
  // through NodeCore::done(): nothing is left to drain but its scratch.
  Request& r = requests_.at(id);
  free_blocks(r.gpu, &r.scratch, /*model=*/false, r.function);
  core_->memory_changed(GpuId{r.gpu});
  collect_device_cost(r.gpu);
  core_->released(id, failure, now_);
}

uint64_t HiberNode::placed_bytes(InstanceId instance, GpuId gpu) const {
  return model_placed_[gpu.value()][index_of(instance)];
}

uint64_t HiberNode::model_bytes(InstanceId instance) const {
  return deployed_[index_of(instance)].model->model_bytes;
}

void HiberNode::execute(RequestId id, Request& r, Duration work, Time now) {
  r.executing = true;
  finishes_.clear();
  co_run_[r.gpu].enter(id, work, deployed_[r.function].model->intensity, now, &finishes_);
  retime(finishes_);
}

void HiberNode::retime(const std::vector<CoRun::Finish>& finishes) {
  for (const CoRun::Finish& f : finishes) {
    Request& r = requests_.at(f.request);
    if (r.finish_at == f.at) continue;
    r.finish_at = f.at;
    queue_->schedule(f.at, this, kDone, f.request.value());
  }
}

// ---- Request ends ----

void HiberNode::fail(RequestId id, Request& r, Time now) {
  if (r.source != Source::kResident) free_model(r.gpu, r.function);
  const Status no_room = error(ErrorCode::kOutOfMemory, "no room on GPU ", r.gpu);
  core_->streaming(id, no_room, now);
  if (r.background) {
    // Nobody says done() for a start-up: it ends when it releases.
    free_blocks(r.gpu, &r.scratch, /*model=*/false, r.function);
    core_->released(id, no_room, now);
    requests_.erase(id);
    return;
  }
  const Status s = core_->done(id, /*failed=*/true, now);
  CHECK(s.ok()) << s;
  recorder_->record(outcome_of(r, StartKind::kFailed));
  requests_.erase(id);
}

void HiberNode::rejected(RequestId id, InstanceId, const Status&) {
  auto it = requests_.find(id);
  CHECK(it != requests_.end()) << "the core shed request " << id << ", which this node never had";
  recorder_->record(outcome_of(it->second, StartKind::kRejected));
  requests_.erase(it);
  // The caller's part: it has its answer, so the request is over.
  const Status s = core_->done(id, /*failed=*/true, now_);
  CHECK(s.ok()) << s;
}

Outcome HiberNode::outcome_of(const Request& r, StartKind kind) const {
  Outcome o;
  o.function = r.function;
  o.node = node_index_;
  o.gpu = r.gpu;
  o.arrival = r.arrival;
  o.kind = kind;
  return o;
}

void HiberNode::on_event(int kind, uint64_t arg, Time now) {
  now_ = now;
  switch (kind) {
    case kStartTransfer: {
      Request& r = requests_.at(RequestId{arg});
      const Model& model = *deployed_[r.function].model;
      int link = r.source == Source::kPeer ? links_->peer_link(r.source_gpu, r.gpu) : -1;
      // A peer copy without a direct link would cross PCIe; the placement never asks for one.
      if (link < 0) link = links_->host_link(r.gpu);
      const Duration exec = r.background ? 0 : r.exec;
      r.pipeline = PipelinedRun(now, model.model_bytes, exec, options_.pipeline.group_bytes);
      links_->start(link, model.model_bytes, this, arg);
      break;
    }
    case kDone: {
      // A request re-timed since this event was scheduled has a later one.
      auto it = requests_.find(RequestId{arg});
      if (it == requests_.end() || it->second.finish_at != now) break;
      complete(RequestId{arg}, now);
      dispatch(now);
      break;
    }
    case kWakeup:
      wakeup_at_ = scheduler::Scheduler::kNever;
      dispatch(now);
      break;
    default: LOG(FATAL) << "unknown event kind " << kind;
  }
}

void HiberNode::transfer_progress(uint64_t tag, Time t, double bytes_done) {
  requests_.at(RequestId{tag}).pipeline.observe(t, bytes_done);
}

void HiberNode::transfer_done(uint64_t tag, Time t) {
  now_ = t;
  const RequestId id{tag};
  Request& r = requests_.at(id);
  r.load_end = t;
  const Time finish = r.pipeline.finish(t);
  const Model& model = *deployed_[r.function].model;
  core_->swap_done(id, Status(), node::SwapStats{model.model_bytes, t - r.dispatched}, t);
  if (r.background) {
    r.finish_at = finish;
    queue_->schedule(finish, this, kDone, tag);
  } else {
    execute(id, r, finish - t, t);
  }
  dispatch(t);
}

void HiberNode::complete(RequestId id, Time now) {
  auto it = requests_.find(id);
  CHECK(it != requests_.end());
  Request& r = it->second;
  if (r.executing) {
    finishes_.clear();
    co_run_[r.gpu].leave(id, now, &finishes_);
    retime(finishes_);
  }
  if (r.background) {
    // A start-up has loaded the model: its GPU is free, and no caller waits for an outcome.
    core_->released(id, Status(), now);
    requests_.erase(it);
    return;
  }
  const Status s = core_->done(id, /*failed=*/false, now);
  CHECK(s.ok()) << s;
  Outcome o = outcome_of(r, StartKind::kResident);
  o.finish = now;
  o.completed = true;
  switch (r.source) {
    case Source::kResident: o.kind = StartKind::kResident; break;
    case Source::kPeer: o.kind = StartKind::kPeer; break;
    case Source::kHost: o.kind = StartKind::kHost; break;
  }
  o.load = r.source == Source::kResident ? 0 : r.load_end - r.dispatched;
  recorder_->record(o);
  recorder_->add_busy(node_index_, r.gpu, r.dispatched, now);
  requests_.erase(it);
}

void HiberNode::finish(Time now) {
  // Blocks of a model the view no longer holds: a replica it dropped without naming it.
  const scheduler::Scheduler& sched = core_->scheduler();
  for (int g = 0; g < static_cast<int>(models_.size()); ++g) {
    for (uint32_t i = 0; i < models_[g].size(); ++i) {
      if (models_[g][i].empty()) continue;
      if (const auto f = sched.functions().find(id_of(i));
          !f || sched.node().find(g, *f) == nullptr) {
        ++lost_replicas_;
      }
    }
  }
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) {
    const Request& r = requests_.at(id);
    if (r.background) continue;
    recorder_->record(outcome_of(r, StartKind::kUnfinished));
    if (r.started) recorder_->add_busy(node_index_, r.gpu, r.dispatched, now);
  }
  requests_.clear();
}

uint64_t HiberNode::device_mallocs() const {
  uint64_t total = 0;
  for (const auto& d : device_) total += d->mallocs();
  return total;
}

std::string HiberNode::summary() const {
  const scheduler::SchedulerCounters& c = core_->scheduler().counters();
  return str_cat(
      "node ", node_index_, ": ", c.arrivals, " arrivals, ", c.completed, " completed (", c.on_time,
      " on time), ", c.resident_starts, " resident (", c.shared_starts, " shared), ", c.peer_swaps,
      " peer swaps, ", c.host_swaps, " host swaps, ", evictions_, " evictions, ",
      c.prewarms > 0 ? str_cat(c.prewarms, " prewarms (", c.prewarm_evictions, " evictions), ")
                     : "",
      pool_failures_, " pool refusals, ", device_mallocs(), " device mallocs",
      lost_replicas_ ? str_cat(", ", lost_replicas_, " replicas lost by the view") : "");
}

void HiberNode::check(Time now) const {
  const scheduler::Scheduler& sched = core_->scheduler();
  const Status s = sched.check_invariants();
  CHECK(s.ok()) << "at " << now << ": " << s;
  const Status p = pools_->check_invariants();
  CHECK(p.ok()) << "at " << now << ": " << p;
  // Every model whose blocks the node holds is a replica in the view, and the other way round.
  const scheduler::NodeState& view = sched.node();
  for (int g = 0; g < static_cast<int>(models_.size()); ++g) {
    for (uint32_t i = 0; i < models_[g].size(); ++i) {
      const std::optional<scheduler::FunctionIndex> f = sched.functions().find(id_of(i));
      const bool in_view = f && view.find(g, *f) != nullptr;
      CHECK_EQ(in_view, !models_[g][i].empty()) << "at " << now << ": GPU " << g << ", function "
                                                << id_of(i) << ": view and pool disagree";
    }
  }
}

}  // namespace hiber::sim
