// Eviction: which model replicas leave GPU g so that N bytes fit there.
//
// The machinery is shared (Evictor); a policy only says in which order candidates leave.
// Rules every policy obeys (Torpor §5.4):
//   - Never evict a replica that is executing (its function runs on that GPU), that is the
//     source of a GPU-to-GPU copy in flight, or that is still loading. They are not candidates.
//   - One replica when full: with `one_replica_when_full` (default on), replicas whose model
//     has another complete replica elsewhere on the node leave before any sole replica, in the
//     policy's order. Eviction only runs when g is full, and the pool view makes a second copy
//     the cheapest thing to drop: the model stays one NVLink copy away. Torpor states the rule
//     for its own policy; we apply it under every ranking, so that comparing rankings (LRU,
//     mCache, ...) compares only the ranking.
//   - The greedy part: candidates leave in order until enough bytes are free. Ties of a
//     policy's keys go to the lower FunctionId, so decisions replay.
// Host copies are authoritative (docs/design.md "Model state"): an eviction copies nothing back, it
// only frees memory.
//
// Policies, selectable by name (policy_factory.h, SchedulerOptions::eviction):
//   "heaviness"  Torpor §5.4 (default): light models first, least recently used first among
//                them; then heavy models, least recently used first.
//   "lru"        least recently used (Torpor-LRU ablation).
//   "lfu"        fewest requests since registration (SageMaker; mCache's baseline), LRU on ties.
//   "random"     uniformly random order from the seeded generator.
//   "mcache"     mCache's importance-aware IAM: utility = penalty x rate / size,
//                rank = log(#cached models with lower utility + b0), evict the minimum rank;
//                ranks are rebuilt every mcache_refresh and set for a model when it is loaded,
//                so between rebuilds they can be stale, as in the paper's shadow-heap design.
//   "cremebrulee"         CremeBrulee online: utility = penalty / (size x B'), B' = 1 / rate,
//                         evict the lowest utility; then the largest-first pass (below).
//   "cremebrulee-oracle"  the same with the true B (requests until next use) from an oracle.
//   "belady"     BeladyMIN: the model whose next request is farthest away (oracle).
//   "slack"      SLO-aware LRU (ours): key = last_used + slack_weight x risk^slack_power,
//                risk = min(1, (host swap + execution) / SLO), the share of its deadline a miss
//                costs the model; evict the lowest key. A model whose host load would eat its
//                whole SLO (Bert-qa: 144 + 43 ms of 200) is a sure miss whenever it is not
//                resident, so it is kept as if used 50 s later; a CNN whose load takes a
//                quarter of its SLO still meets it from the host and gets about 1 s. The cube
//                makes the order nearly a class order at the top and plain LRU at the bottom;
//                the bounded bonus means no model is pinned forever. It is the "fair classes"
//                mechanism: memory goes to the models that cannot comply without it.
// penalty = FunctionTable::swap_estimate (the host->GPU load time: in Hiber the host copy is
// always there, so a miss costs one PCIe swap); rate = FunctionTable::arrival_rate.
// CremeBrulee's largest-first pass: once the greedy picks free enough, they are re-sorted by
// size, largest first, and taken until enough is free, "in case this reduces the number of
// models removed" (notes-caching-papers.md B.2.4).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/function_table.h"
#include "scheduler/node_state.h"
#include "scheduler/oracle.h"
#include "scheduler/random.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

struct EvictionOptions {
  // Sole replicas leave only after every duplicate on the GPU (see above).
  bool one_replica_when_full = true;
  // mCache's b0 (> 0): log(0 + b0) must exist for the least useful model; 1 makes it rank 0.
  double mcache_b0 = 1.0;
  // How often mCache rebuilds its ranks. The paper gives no period; 10 s is a few dozen
  // requests of Torpor's typical function and far longer than a decision, so the rebuild
  // (O(models log models)) stays off the common path.
  Duration mcache_refresh = 10 * kSecond;
  // slack: a replica's key is last_used + slack_weight x risk^slack_power, risk = the share of
  // its SLO a host load and its execution take (at most 1). See "slack" above for the values.
  Duration slack_weight = 60 * kSecond;
  double slack_power = 3;
};

// A replica that may leave, with the policy's keys.
struct EvictionCandidate {
  FunctionIndex function;
  FunctionId id;
  int gpu = -1;
  uint64_t bytes = 0;
  Time last_used = 0;
  bool duplicate = false;  // another complete replica exists on another GPU
  double key = 0;          // policy's order: lower leaves first
  double key2 = 0;         // tie-break, lower first
};

struct EvictionContext {
  Time now = 0;
  const NodeState& node;
  const FunctionTable& functions;
  Rng& rng;
  const FutureOracle* oracle = nullptr;
  // Arrival index of the request the room is for (oracle policies count from it).
  uint64_t arrival_index = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Sets key (and key2) of every candidate; lower leaves first.
  virtual void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) = 0;
  // Given the greedy victims in leaving order (together enough for `bytes_needed`), may keep
  // some. The default keeps them all.
  virtual void refine(std::vector<EvictionCandidate>& victims, uint64_t bytes_needed) const;
  // A model replica was placed on a GPU (mCache sets its rank here).
  virtual void on_loaded(FunctionIndex f, const EvictionContext& ctx);
};

// A replica the caller must free.
struct Eviction {
  FunctionId function;
  int gpu = -1;
  uint64_t bytes = 0;
  friend bool operator==(const Eviction&, const Eviction&) = default;
};

// Runs a policy under the shared rules. Keeps its scratch vectors, so a plan allocates only
// when a GPU holds more replicas than any plan before.
class Evictor {
 public:
  Evictor(std::unique_ptr<EvictionPolicy> policy, const EvictionOptions& options);

  // Victims on GPU g so that free_bytes(g) >= bytes afterwards, never `keep` (the model being
  // placed). Appends them to `out` in leaving order. false (and `out` unchanged) when even
  // evicting every candidate would not make room. An over-committed GPU (more used than its
  // capacity, after a model grew) counts its excess as needed too.
  bool plan(int g, uint64_t bytes, std::optional<FunctionIndex> keep, const EvictionContext& ctx,
            std::vector<Eviction>* out);

  // The victims of the last plan, with their function indices (empty when it needed none or
  // was refused).
  const std::vector<EvictionCandidate>& victims() const { return victims_; }

  EvictionPolicy& policy() { return *policy_; }
  const EvictionOptions& options() const { return options_; }

 private:
  // A candidate's place in the leaving order: (sole replica, key, key2, FunctionId), the two
  // keys as one unsigned integer that orders like the pair, so that comparing is a flag check
  // and one 128-bit comparison.
  struct Rank {
    unsigned __int128 keys;
    FunctionId id;
    uint32_t index;  // in candidates_
    bool sole;       // no other complete replica (leaves after every duplicate)
  };
  static bool before(const Rank& a, const Rank& b) {
    if (a.sole != b.sole) return b.sole;
    if (a.keys != b.keys) return a.keys < b.keys;
    return a.id < b.id;
  }

  std::unique_ptr<EvictionPolicy> policy_;
  EvictionOptions options_;
  std::vector<EvictionCandidate> candidates_;
  std::vector<Rank> ranks_;
  std::vector<EvictionCandidate> victims_;
};

std::unique_ptr<EvictionPolicy> make_heaviness_eviction();
std::unique_ptr<EvictionPolicy> make_lru_eviction();
std::unique_ptr<EvictionPolicy> make_lfu_eviction();
std::unique_ptr<EvictionPolicy> make_random_eviction();
std::unique_ptr<EvictionPolicy> make_belady_eviction();
std::unique_ptr<EvictionPolicy> make_mcache_eviction(const EvictionOptions& options);
std::unique_ptr<EvictionPolicy> make_cremebrulee_eviction(bool oracle);
std::unique_ptr<EvictionPolicy> make_slack_eviction(const EvictionOptions& options);

}  // namespace hiber::scheduler
