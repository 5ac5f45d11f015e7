#include "scheduler/node_state.h"

#include <algorithm>

namespace hiber::scheduler {

NodeState::NodeState(const Topology& topology)
    : topology_(&topology),
      gpus_(topology.gpu_count()),
      available_(topology.all_gpus()),
      healthy_(topology.all_gpus()) {
  for (int g = 0; g < topology.gpu_count(); ++g) gpus_[g].capacity = topology.memory_bytes(g);
}

uint64_t NodeState::free_bytes(int g) const {
  const GpuState& s = gpus_[g];
  const uint64_t taken = s.reserved + s.used;
  return taken >= s.capacity ? 0 : s.capacity - taken;
}

uint64_t NodeState::usable_bytes(int g) const {
  const GpuState& s = gpus_[g];
  return s.reserved >= s.capacity ? 0 : s.capacity - s.reserved;
}

const Replica* NodeState::find(int g, FunctionIndex f) const {
  for (const Replica& r : gpus_[g].replicas) {
    if (r.function == f) return &r;
  }
  return nullptr;
}

Replica* NodeState::find(int g, FunctionIndex f) {
  for (Replica& r : gpus_[g].replicas) {
    if (r.function == f) return &r;
  }
  return nullptr;
}

int NodeState::replica_count(FunctionIndex f) const { return __builtin_popcountll(holders(f)); }

void NodeState::ensure_function_slots(size_t slots) {
  if (holders_.size() < slots) holders_.resize(slots, 0);
}

Replica& NodeState::add_replica(int g, FunctionIndex f, uint64_t bytes, bool loading, Time now) {
  GpuState& s = gpus_[g];
  s.replicas.push_back(Replica{f, bytes, loading, 0, now});
  s.used += bytes;
  if (!loading) holders_[f.value()] |= gpu_bit(g);
  return s.replicas.back();
}

void NodeState::remove_replica(int g, FunctionIndex f) {
  GpuState& s = gpus_[g];
  for (size_t i = 0; i < s.replicas.size(); ++i) {
    if (s.replicas[i].function != f) continue;
    s.used -= s.replicas[i].bytes;
    // Order of replicas carries no meaning; swap-remove keeps it O(1).
    s.replicas[i] = s.replicas.back();
    s.replicas.pop_back();
    holders_[f.value()] &= ~gpu_bit(g);
    return;
  }
}

void NodeState::set_replica_bytes(int g, FunctionIndex f, uint64_t bytes) {
  if (Replica* r = find(g, f)) {
    gpus_[g].used = gpus_[g].used - r->bytes + bytes;
    r->bytes = bytes;
  }
}

void NodeState::mark_complete(int g, Replica& replica) {
  replica.loading = false;
  holders_[replica.function.value()] |= gpu_bit(g);
}

void NodeState::set_running(int g, RequestId request, std::optional<FunctionIndex> f) {
  gpus_[g].running = request;
  gpus_[g].running_function = f;
  available_ &= ~gpu_bit(g);
}

void NodeState::add_sharing(int g, RequestId request, FunctionIndex f) {
  gpus_[g].sharing.push_back(CoRunning{request, f});
}

void NodeState::clear_running(int g, RequestId request) {
  GpuState& gpu = gpus_[g];
  if (gpu.running != request) {
    std::erase_if(gpu.sharing, [&](const CoRunning& c) { return c.request == request; });
    return;
  }
  if (!gpu.sharing.empty()) {
    gpu.running = gpu.sharing.front().request;
    gpu.running_function = gpu.sharing.front().function;
    gpu.sharing.erase(gpu.sharing.begin());
    return;
  }
  gpu.running.reset();
  gpu.running_function.reset();
  available_ |= gpu_bit(g) & healthy_ & ~held_;
}

void NodeState::clear_running(int g) {
  if (gpus_[g].running) clear_running(g, *gpus_[g].running);
}

bool NodeState::executing(int g, FunctionIndex f) const {
  const GpuState& gpu = gpus_[g];
  if (gpu.running_function == f) return true;
  return std::any_of(gpu.sharing.begin(), gpu.sharing.end(),
                     [&](const CoRunning& c) { return c.function == f; });
}

void NodeState::set_healthy(int g, bool healthy) {
  if (healthy) {
    healthy_ |= gpu_bit(g);
    if (!gpus_[g].running) available_ |= gpu_bit(g) & ~held_;
  } else {
    healthy_ &= ~gpu_bit(g);
    available_ &= ~gpu_bit(g);
  }
}

void NodeState::set_held(int g, bool held) {
  if (held) {
    held_ |= gpu_bit(g);
    available_ &= ~gpu_bit(g);
  } else {
    held_ &= ~gpu_bit(g);
    if (!gpus_[g].running) available_ |= gpu_bit(g) & healthy_;
  }
}

void NodeState::set_host_loading(int g, std::optional<FunctionIndex> f) {
  gpus_[g].host_loading = f;
  if (!f) {
    host_loading_mask_ &= ~gpu_bit(g);
  } else {
    host_loading_mask_ |= gpu_bit(g);
  }
}

Status NodeState::check_invariants() const {
  std::vector<GpuMask> holders(holders_.size(), 0);
  for (int g = 0; g < gpu_count(); ++g) {
    const GpuState& s = gpus_[g];
    uint64_t used = 0;
    for (size_t i = 0; i < s.replicas.size(); ++i) {
      const Replica& r = s.replicas[i];
      used += r.bytes;
      if (r.function.value() >= holders.size())
        return error(ErrorCode::kIllegalState, "GPU ", g, " holds unknown function index ",
                     r.function);
      for (size_t j = i + 1; j < s.replicas.size(); ++j) {
        if (s.replicas[j].function == r.function)
          return error(ErrorCode::kIllegalState, "GPU ", g, " holds two replicas of ", r.function);
      }
      if (!r.loading) holders[r.function.value()] |= gpu_bit(g);
    }
    if (used != s.used)
      return error(ErrorCode::kIllegalState, "GPU ", g, " used ", s.used, " != replicas ", used);
    const bool running = s.running.has_value();
    const bool should_be_available = !running && (healthy_ & ~held_ & gpu_bit(g)) != 0;
    if (should_be_available != ((available_ & gpu_bit(g)) != 0))
      return error(ErrorCode::kIllegalState, "GPU ", g,
                   " availability disagrees with its health, hold and request");
    if (running != s.running_function.has_value())
      return error(ErrorCode::kIllegalState, "GPU ", g, " running request and function disagree");
    if (!running && !s.sharing.empty())
      return error(ErrorCode::kIllegalState, "GPU ", g, " is shared with nothing running");
    for (const CoRunning& c : s.sharing) {
      if (c.request == s.running)
        return error(ErrorCode::kIllegalState, "GPU ", g, " shares request ", c.request,
                     " with itself");
    }
    if (!running && s.host_loading)
      return error(ErrorCode::kIllegalState, "GPU ", g, " loads from the host with no request");
    if (s.host_loading.has_value() != ((host_loading_mask_ & gpu_bit(g)) != 0))
      return error(ErrorCode::kIllegalState, "GPU ", g, " host-loading mask disagrees");
  }
  for (size_t f = 0; f < holders.size(); ++f) {
    if (holders[f] != holders_[f])
      return error(ErrorCode::kIllegalState, "holders of function index ", f, " are ", holders_[f],
                   ", replicas say ", holders[f]);
  }
  return Status();
}

}  // namespace hiber::scheduler
