#include "sim/balancer.h"

#include <optional>

#include <glog/logging.h>

#include "scheduler/cluster_balancer.h"

namespace hiber::sim {

double expected_load(const SimFunction& function) {
  const Model& model = paper_models()[function.model];
  return function.rate_per_min / 60.0 * static_cast<double>(model.exec) / kSecond;
}

std::vector<int> balance_functions(const std::vector<SimFunction>& functions, int nodes) {
  // At deployment every node is up and no model is resident anywhere yet, so the shared rule
  // comes down to the least expected load.
  std::vector<scheduler::NodeCandidate> candidates(static_cast<size_t>(nodes));
  std::vector<int> node_of;
  node_of.reserve(functions.size());
  for (const SimFunction& f : functions) {
    const std::optional<size_t> best = scheduler::choose_node(candidates);
    CHECK(best.has_value()) << "balance_functions needs at least one node";
    candidates[*best].expected_load += expected_load(f);
    node_of.push_back(static_cast<int>(*best));
  }
  return node_of;
}

}  // namespace hiber::sim
