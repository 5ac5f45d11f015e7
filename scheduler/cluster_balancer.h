// Which node of a cluster a function's work goes to: the rule hiber-sim's cluster balancer
// (sim/balancer.h) and the router (router/, docs/router.md) share, so the simulated cluster and
// the real one choose alike.
//
// The rule: among the nodes that are up, a node where the function's model is already resident
// on a GPU first (no swap-in; the least loaded of those), else the node with the least expected
// load, where a node's expected load is the GPU-seconds per second of the work already sent
// there. Ties go to the lower index, so the choice is deterministic.
//
// A pure function: no I/O, no threads, no state.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

namespace hiber::scheduler {

struct NodeCandidate {
  bool up = true;            // answering; a node that is down is never chosen
  bool resident = false;     // the function's model is resident on one of its GPUs
  double expected_load = 0;  // GPU-seconds per second of the work already sent there
};

// The index of the chosen node in `nodes`; nullopt when no node is up.
std::optional<size_t> choose_node(std::span<const NodeCandidate> nodes);

}  // namespace hiber::scheduler
