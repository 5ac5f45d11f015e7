#include "scheduler/eviction.h"

#include <algorithm>

namespace hiber::scheduler {

void EvictionPolicy::refine(std::vector<EvictionCandidate>&, uint64_t) const {}
void EvictionPolicy::on_loaded(FunctionIndex, const EvictionContext&) {}

Evictor::Evictor(std::unique_ptr<EvictionPolicy> policy, const EvictionOptions& options)
    : policy_(std::move(policy)), options_(options) {}

bool Evictor::plan(int g, uint64_t bytes, FunctionIndex keep, const EvictionContext& ctx,
                   std::vector<Eviction>* out) {
  const NodeState& node = ctx.node;
  const uint64_t free = node.free_bytes(g);
  if (free >= bytes) return true;
  const uint64_t needed = bytes - free;

  const GpuState& gpu = node.gpu(g);
  candidates_.clear();
  uint64_t available = 0;
  for (const Replica& r : gpu.replicas) {
    // Protected: in flight, a copy's source, executing here, or the model being placed.
    if (r.loading || r.source_pins > 0 || r.function == gpu.running_function ||
        r.function == keep)
      continue;
    EvictionCandidate c;
    c.function = r.function;
    c.id = ctx.functions.id(r.function);
    c.gpu = g;
    c.bytes = r.bytes;
    c.last_used = r.last_used;
    c.duplicate = (node.holders(r.function) & ~gpu_bit(g)) != 0;
    candidates_.push_back(c);
    available += r.bytes;
  }
  if (available < needed) return false;

  policy_->score(candidates_, ctx);
  const bool duplicates_first = options_.one_replica_when_full;
  // "a before b": a leaves first.
  auto before = [duplicates_first](const EvictionCandidate& a, const EvictionCandidate& b) {
    if (duplicates_first && a.duplicate != b.duplicate) return a.duplicate;
    if (a.key != b.key) return a.key < b.key;
    if (a.key2 != b.key2) return a.key2 < b.key2;
    return a.id < b.id;
  };
  // Usually one or two victims among dozens of replicas: a heap pops them in O(k + v log k)
  // where a full sort would cost O(k log k) on every plan.
  auto after = [&before](const EvictionCandidate& a, const EvictionCandidate& b) {
    return before(b, a);
  };
  std::make_heap(candidates_.begin(), candidates_.end(), after);
  victims_.clear();
  uint64_t freed = 0;
  auto end = candidates_.end();
  while (freed < needed) {
    std::pop_heap(candidates_.begin(), end, after);
    --end;
    victims_.push_back(*end);
    freed += end->bytes;
  }
  policy_->refine(victims_, needed);
  for (const EvictionCandidate& v : victims_) out->push_back(Eviction{v.id, g, v.bytes});
  return true;
}

}  // namespace hiber::scheduler
