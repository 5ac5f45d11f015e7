// Placement: which available GPU runs a request, and where its model comes from.
//
// Two policies, selectable by name (policy_factory.h, SchedulerOptions::placement):
//
// "algorithm1" (default): Torpor's Algorithm 1 (§5.3), exactly:
//   1. the model is resident on an available GPU: run there, no swap;
//   2. it is resident only on busy GPUs: take the (available g, holder m) pair with the fastest
//      direct link and copy GPU-to-GPU from m to g;
//   3. it is resident nowhere: load from the host onto an available GPU whose PCIe neighbours
//      are not loading from the host; failing that, one whose loading neighbours all load
//      light models; failing that, any available GPU;
//   4. no GPU is available: the request waits in the queue.
// Both only ever choose among the GPUs the context does not exclude (PlacementContext::excluded):
// the dispatcher excludes a GPU where eviction could not make room for this model, and gShare's
// queue names the one GPU a request may take.
// Where the paper says "any GPU" we choose deterministically, so runs replay: in branch 1 the
// lowest-numbered GPU; in branches 2 and 3 the candidate with the most free memory (fewest
// evictions before the load), then the lowest number (branch 2: then the lowest holder).
// Two cases the paper's node never meets, handled so that any node works:
//   - GPUs too small to ever hold the model (capacity minus reserved bytes) are not candidates
//     in branches 2-3; if no available GPU is big enough the request waits;
//   - in branch 2, if no (available, holder) pair has a direct link (a node without NVLink), the
//     copy would cross PCIe like a host load does, so branch 3 decides instead.
// "Neighbour" is every other GPU behind the same PCIe switch (Topology::pcie_neighbours), and
// "loading" means a host->GPU copy in flight: a GPU-to-GPU copy does not use the switch's host
// link.
//
// "random": the paper's Torpor-Random ablation (§7.3): the model's resident replica on an
// available GPU if there is one (uniformly among several), otherwise a uniformly random
// available GPU loaded from the host. Blind to NVLink and to heaviness.
#pragma once

#include <memory>
#include <string_view>

#include "scheduler/function_table.h"
#include "scheduler/node_state.h"
#include "scheduler/random.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

// Which rule chose a placement; tests assert it and metrics count it.
enum class PlacementRule : uint8_t {
  kWait,                 // no available GPU (that can hold the model)
  kResident,             // Algorithm 1 line 8
  kPeer,                 // line 11
  kHostQuietNeighbours,  // line 13: no neighbour loading from the host
  kHostLightNeighbours,  // line 15: neighbours load light models only
  kHostAny,              // line 17
  kRandom,               // the "random" policy's host load
  kShared,               // spatial sharing: beside a running request, model resident (scheduler.h)
};

const char* placement_rule_name(PlacementRule rule);

struct Placement {
  int gpu = -1;  // -1: wait
  Source source = Source::kHost;
  int source_gpu = -1;  // the holder for Source::kPeer, else -1
  PlacementRule rule = PlacementRule::kWait;

  bool placed() const { return gpu >= 0; }
};

struct PlacementContext {
  const NodeState& node;
  const FunctionTable& functions;
  Rng& rng;
  // GPUs this placement must not choose, even when available (and even where the model is
  // resident).
  GpuMask excluded = 0;
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string_view name() const = 0;
  // Chooses a GPU for a request of function f. Never fails: "wait" is a placement.
  virtual Placement place(FunctionIndex f, const PlacementContext& ctx) = 0;
};

std::unique_ptr<PlacementPolicy> make_algorithm1_placement();
std::unique_ptr<PlacementPolicy> make_random_placement();

}  // namespace hiber::scheduler
