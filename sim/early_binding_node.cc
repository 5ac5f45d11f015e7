#include "sim/early_binding_node.h"

#include <algorithm>

#include <glog/logging.h>

namespace hiber::sim {
namespace {

uint64_t pack(uint32_t index, uint32_t version) { return uint64_t{version} << 32 | index; }

}  // namespace

Result<EarlyBinding> parse_early_binding(std::string_view name) {
  if (name == "native") return EarlyBinding::kNative;
  if (name == "infless-ka") return EarlyBinding::kInflessKeepAlive;
  if (name == "nonswap") return EarlyBinding::kNonSwap;
  return error(ErrorCode::kInvalidValue, "unknown early-binding system '", name,
               "' (known: native, infless-ka, nonswap)");
}

const char* early_binding_name(EarlyBinding kind) {
  switch (kind) {
    case EarlyBinding::kNative: return "native";
    case EarlyBinding::kInflessKeepAlive: return "infless-ka";
    case EarlyBinding::kNonSwap: return "nonswap";
  }
  return "unknown";
}

EarlyBindingNode::EarlyBindingNode(const EarlyBindingOptions& options, EventQueue* queue,
                                   Recorder* recorder, int node_index)
    : options_(options), queue_(queue), recorder_(recorder), node_index_(node_index) {}

Result<std::unique_ptr<EarlyBindingNode>> EarlyBindingNode::create(
    const NodeConfig& config, const EarlyBindingOptions& options, EventQueue* queue,
    Recorder* recorder, int node_index) {
  if (config.gpus.empty()) return error(ErrorCode::kInvalidValue, "a node needs GPUs");
  if (options.keep_alive < 0) return error(ErrorCode::kInvalidValue, "keep-alive must be >= 0");
  std::unique_ptr<EarlyBindingNode> node(
      new EarlyBindingNode(options, queue, recorder, node_index));
  for (const GpuSpec& g : config.gpus) {
    if (g.memory_bytes <= options.gpu_reserve_bytes)
      return error(ErrorCode::kInvalidValue, "GPU memory ", g.memory_bytes,
                   " is not above the reserve ", options.gpu_reserve_bytes);
    Gpu gpu;
    gpu.capacity = g.memory_bytes - options.gpu_reserve_bytes;
    node->gpus_.push_back(std::move(gpu));
  }
  return node;
}

int EarlyBindingNode::roomiest(uint64_t bytes) const {
  int best = -1;
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    const uint64_t free = gpus_[g].capacity - gpus_[g].used;
    if (free < bytes) continue;
    if (best < 0 || free > gpus_[best].capacity - gpus_[best].used) best = g;
  }
  return best;
}

Status EarlyBindingNode::add_function(uint32_t index, const SimFunction& function, Time now) {
  if (function.model < 0 || function.model >= static_cast<int>(paper_models().size()))
    return error(ErrorCode::kInvalidValue, "function ", function.name, ": no model ",
                 function.model);
  if (index >= instances_.size()) instances_.resize(index + 1);
  Instance& inst = instances_[index];
  if (inst.function != nullptr)
    return error(ErrorCode::kInvalidValue, "function ", function.name, " deployed twice");
  const Model& model = paper_models()[function.model];
  inst.function = &function;
  const bool remoting = options_.kind == EarlyBinding::kNonSwap;
  inst.footprint = remoting ? model.model_bytes + model.scratch_bytes : model.native_footprint;
  inst.exec = remoting ? model.exec : model.native_exec;
  inst.model_class = model.model_class;
  inst.cold_start = model.cold_start;
  inst.last_used = now;
  // Deployed warm while memory lasts ("all functions are warmed up", §7).
  const int g = roomiest(inst.footprint);
  if (g >= 0) {
    inst.state = State::kWarm;
    inst.gpu = g;
    gpus_[g].used += inst.footprint;
    if (options_.kind == EarlyBinding::kInflessKeepAlive)
      queue_->schedule(now + options_.keep_alive, this, kExpire, pack(index, inst.version));
  }
  return Status();
}

void EarlyBindingNode::arrive(uint32_t index, Time now) {
  CHECK_LT(index, instances_.size());
  Instance& inst = instances_[index];
  CHECK(inst.function != nullptr) << "arrival for a function this node does not host";
  switch (inst.state) {
    case State::kWarm: enqueue(index, {index, now, 0, StartKind::kWarm}, now); return;
    case State::kStarting: inst.waiting.push_back(now); return;
    case State::kNone:
      if (options_.kind != EarlyBinding::kInflessKeepAlive) {
        ++rejected_;
        Outcome o;
        o.function = index;
        o.node = node_index_;
        o.arrival = now;
        o.kind = StartKind::kRejected;
        recorder_->record(o);
        return;
      }
      inst.waiting.push_back(now);
      if (!inst.pending && !cold_start(index, now)) {
        inst.pending = true;
        pending_.push_back(index);
      }
      return;
  }
}

int EarlyBindingNode::reclaim(uint64_t bytes) {
  // Idle instances per GPU, least recently used first; then the GPU that needs the fewest of
  // them shut down for `bytes` to fit (the lower GPU on ties).
  std::vector<std::vector<uint32_t>> idle(gpus_.size());
  for (uint32_t i = 0; i < instances_.size(); ++i) {
    const Instance& in = instances_[i];
    if (in.state == State::kWarm && in.in_flight == 0) idle[in.gpu].push_back(i);
  }
  int best = -1;
  size_t best_count = 0;
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    std::vector<uint32_t>& list = idle[g];
    std::sort(list.begin(), list.end(), [this](uint32_t a, uint32_t b) {
      const Instance& x = instances_[a];
      const Instance& y = instances_[b];
      return x.last_used != y.last_used ? x.last_used < y.last_used : a < b;
    });
    uint64_t free = gpus_[g].capacity - gpus_[g].used;
    size_t count = 0;
    while (free < bytes && count < list.size()) free += instances_[list[count++]].footprint;
    if (free < bytes) continue;
    if (best < 0 || count < best_count) {
      best = g;
      best_count = count;
    }
  }
  if (best < 0) return -1;
  for (size_t k = 0; k < best_count; ++k) {
    unload(idle[best][k]);
    ++reclaimed_;
  }
  return best;
}

void EarlyBindingNode::unload(uint32_t index) {
  Instance& inst = instances_[index];
  gpus_[inst.gpu].used -= inst.footprint;
  inst.state = State::kNone;
  inst.gpu = -1;
  ++inst.version;
}

bool EarlyBindingNode::cold_start(uint32_t index, Time now) {
  Instance& inst = instances_[index];
  int g = roomiest(inst.footprint);
  if (g < 0) g = reclaim(inst.footprint);
  if (g < 0) return false;
  inst.state = State::kStarting;
  inst.gpu = g;
  gpus_[g].used += inst.footprint;
  ++inst.version;
  ++cold_starts_;
  queue_->schedule(now + inst.cold_start, this, kReady, pack(index, inst.version));
  return true;
}

void EarlyBindingNode::enqueue(uint32_t index, const Queued& q, Time now) {
  Instance& inst = instances_[index];
  ++inst.in_flight;
  ++inst.version;  // not idle any more: a pending keep-alive expiry is void
  gpus_[inst.gpu].fifo.push_back(q);
  run_next(inst.gpu, now);
}

void EarlyBindingNode::run_next(int g, Time now) {
  Gpu& gpu = gpus_[g];
  if (gpu.running || gpu.fifo.empty()) return;
  gpu.current = gpu.fifo.front();
  gpu.fifo.pop_front();
  gpu.running = true;
  gpu.started = now;
  Instance& inst = instances_[gpu.current.function];
  const Duration exec = options_.exec_variation.scale(inst.exec, inst.model_class,
                                                      gpu.current.function, inst.served++);
  queue_->schedule(now + exec, this, kDone, g);
}

void EarlyBindingNode::retry_pending(Time now) {
  // In arrival order; the first that still finds no room stops the others (they wait behind
  // it, as requests do in a FIFO), which also keeps each completion's work small.
  while (!pending_.empty()) {
    const uint32_t index = pending_.front();
    if (!cold_start(index, now)) return;
    instances_[index].pending = false;
    pending_.pop_front();
  }
}

void EarlyBindingNode::on_event(int kind, uint64_t arg, Time now) {
  switch (kind) {
    case kDone: {
      const int g = static_cast<int>(arg);
      Gpu& gpu = gpus_[g];
      const Queued q = gpu.current;
      gpu.running = false;
      Outcome o;
      o.function = q.function;
      o.node = node_index_;
      o.gpu = g;
      o.arrival = q.arrival;
      o.finish = now;
      o.load = q.load;
      o.kind = q.kind;
      o.completed = true;
      recorder_->record(o);
      recorder_->add_busy(node_index_, g, gpu.started, now);
      Instance& inst = instances_[q.function];
      inst.last_used = now;
      if (--inst.in_flight == 0 && options_.kind == EarlyBinding::kInflessKeepAlive) {
        ++inst.version;
        queue_->schedule(now + options_.keep_alive, this, kExpire, pack(q.function, inst.version));
        run_next(g, now);
        retry_pending(now);  // an idle instance may now be reclaimed
        return;
      }
      run_next(g, now);
      return;
    }
    case kReady: {
      const uint32_t index = static_cast<uint32_t>(arg);
      Instance& inst = instances_[index];
      if (inst.version != static_cast<uint32_t>(arg >> 32) || inst.state != State::kStarting)
        return;
      inst.state = State::kWarm;
      inst.last_used = now;
      std::vector<Time> waiting;
      waiting.swap(inst.waiting);
      for (Time arrival : waiting)
        enqueue(index, {index, arrival, now - arrival, StartKind::kCold}, now);
      if (inst.in_flight == 0) {
        ++inst.version;
        queue_->schedule(now + options_.keep_alive, this, kExpire, pack(index, inst.version));
      }
      return;
    }
    case kExpire: {
      const uint32_t index = static_cast<uint32_t>(arg);
      Instance& inst = instances_[index];
      if (inst.version != static_cast<uint32_t>(arg >> 32) || inst.state != State::kWarm ||
          inst.in_flight != 0)
        return;
      unload(index);
      ++expired_;
      retry_pending(now);
      return;
    }
    default: LOG(FATAL) << "unknown event kind " << kind;
  }
}

void EarlyBindingNode::record_unfinished(uint32_t function, Time arrival) {
  Outcome o;
  o.function = function;
  o.node = node_index_;
  o.arrival = arrival;
  o.kind = StartKind::kUnfinished;
  recorder_->record(o);
}

void EarlyBindingNode::finish(Time now) {
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    Gpu& gpu = gpus_[g];
    if (gpu.running) {
      record_unfinished(gpu.current.function, gpu.current.arrival);
      recorder_->add_busy(node_index_, g, gpu.started, now);
      gpu.running = false;
    }
    for (const Queued& q : gpu.fifo) record_unfinished(q.function, q.arrival);
    gpu.fifo.clear();
  }
  for (uint32_t i = 0; i < instances_.size(); ++i) {
    for (Time arrival : instances_[i].waiting) record_unfinished(i, arrival);
    instances_[i].waiting.clear();
  }
  pending_.clear();
}

int EarlyBindingNode::instances() const {
  int n = 0;
  for (const Instance& i : instances_) n += i.state != State::kNone;
  return n;
}

std::string EarlyBindingNode::summary() const {
  return str_cat("node ", node_index_, " (", early_binding_name(options_.kind), "): ", instances(),
                 " instances up, ", cold_starts_, " cold starts, ", rejected_, " rejected, ",
                 reclaimed_, " reclaimed, ", expired_, " expired");
}

}  // namespace hiber::sim
