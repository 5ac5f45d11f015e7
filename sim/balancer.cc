#include "sim/balancer.h"

namespace hiber::sim {

double expected_load(const SimFunction& function) {
  const Model& model = paper_models()[function.model];
  return function.rate_per_min / 60.0 * static_cast<double>(model.exec) / kSecond;
}

std::vector<int> balance_functions(const std::vector<SimFunction>& functions, int nodes) {
  std::vector<double> load(nodes, 0.0);
  std::vector<int> node_of;
  node_of.reserve(functions.size());
  for (const SimFunction& f : functions) {
    int best = 0;
    for (int n = 1; n < nodes; ++n) {
      if (load[n] < load[best]) best = n;
    }
    load[best] += expected_load(f);
    node_of.push_back(best);
  }
  return node_of;
}

}  // namespace hiber::sim
