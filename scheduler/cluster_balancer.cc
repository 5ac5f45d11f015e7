#include "scheduler/cluster_balancer.h"

namespace hiber::scheduler {

std::optional<size_t> choose_node(std::span<const NodeCandidate> nodes) {
  std::optional<size_t> best;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const NodeCandidate& candidate = nodes[n];
    if (!candidate.up) continue;
    if (!best) {
      best = n;
      continue;
    }
    const NodeCandidate& current = nodes[*best];
    // Residency first, then load; strict comparisons keep the lower index on ties.
    if (candidate.resident != current.resident) {
      if (candidate.resident) best = n;
    } else if (candidate.expected_load < current.expected_load) {
      best = n;
    }
  }
  return best;
}

}  // namespace hiber::scheduler
