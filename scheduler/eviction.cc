#include "scheduler/eviction.h"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace hiber::scheduler {
namespace {

// a + b, or UINT64_MAX where that overflows (reserved bytes come from the caller).
uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// A double as an unsigned integer of the same order (-0 as +0; the keys are never NaN).
uint64_t ordered_bits(double d) {
  const uint64_t u = std::bit_cast<uint64_t>(d + 0.0);
  return (u >> 63) != 0 ? ~u : u | (uint64_t{1} << 63);
}

}  // namespace

void EvictionPolicy::refine(std::vector<EvictionCandidate>&, uint64_t) const {}
void EvictionPolicy::on_loaded(FunctionIndex, const EvictionContext&) {}

Evictor::Evictor(std::unique_ptr<EvictionPolicy> policy, const EvictionOptions& options)
    : policy_(std::move(policy)), options_(options) {}

bool Evictor::plan(int g, uint64_t bytes, std::optional<FunctionIndex> keep,
                   const EvictionContext& ctx, std::vector<Eviction>* out) {
  const NodeState& node = ctx.node;
  const GpuState& gpu = node.gpu(g);
  // Not bytes - free_bytes(g): free_bytes is 0 on an over-committed GPU, which would hide the
  // excess that must go too.
  const uint64_t wanted = saturating_add(saturating_add(gpu.reserved, gpu.used), bytes);
  victims_.clear();
  if (wanted <= gpu.capacity) return true;
  const uint64_t needed = wanted - gpu.capacity;

  candidates_.clear();
  uint64_t available = 0;
  for (const Replica& r : gpu.replicas) {
    // Protected: in flight, a copy's source, executing here, or the model being placed.
    if (r.loading || r.source_pins > 0 || node.executing(g, r.function) || r.function == keep)
      continue;
    candidates_.push_back(EvictionCandidate{
        .function = r.function,
        .id = ctx.functions.id(r.function),
        .gpu = g,
        .bytes = r.bytes,
        .last_used = r.last_used,
        .duplicate = (node.holders(r.function) & ~gpu_bit(g)) != 0,
    });
    available += r.bytes;
  }
  if (available < needed) return false;

  policy_->score(candidates_, ctx);
  ranks_.clear();
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const EvictionCandidate& c = candidates_[i];
    ranks_.push_back(
        Rank{static_cast<unsigned __int128>(ordered_bits(c.key)) << 64 | ordered_bits(c.key2), c.id,
             static_cast<uint32_t>(i), !(options_.one_replica_when_full && c.duplicate)});
  }
  // Usually one victim among dozens of replicas, sometimes several (a large model displacing
  // small ones). The first kScans are picked by a scan each: k - 1 comparisons whose branches
  // predict well (the running minimum rarely changes). Building a heap costs about 2k
  // comparisons that mispredict half the time, so a heap takes over only past kScans victims:
  // O(k + v log k), never O(k^2) nor a full sort.
  constexpr size_t kScans = 8;
  uint64_t freed = 0;
  size_t taken = 0;
  auto take = [&](const Rank& r) {
    const EvictionCandidate& c = candidates_[r.index];
    victims_.push_back(c);
    freed += c.bytes;
  };
  for (; freed < needed && taken < kScans; ++taken) {
    size_t first = taken;
    for (size_t i = taken + 1; i < ranks_.size(); ++i) {
      if (before(ranks_[i], ranks_[first])) first = i;
    }
    std::swap(ranks_[taken], ranks_[first]);
    take(ranks_[taken]);
  }
  if (freed < needed) {
    auto after = [](const Rank& a, const Rank& b) { return before(b, a); };
    const auto rest = ranks_.begin() + static_cast<std::ptrdiff_t>(taken);
    std::make_heap(rest, ranks_.end(), after);
    for (auto end = ranks_.end(); freed < needed; --end) {
      std::pop_heap(rest, end, after);
      take(*(end - 1));
    }
  }
  policy_->refine(victims_, needed);
  for (const EvictionCandidate& v : victims_) out->push_back(Eviction{v.id, g, v.bytes});
  return true;
}

}  // namespace hiber::scheduler
