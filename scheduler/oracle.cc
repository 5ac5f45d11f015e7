#include "scheduler/oracle.h"

#include <algorithm>
#include <limits>

namespace hiber::scheduler {

SequenceOracle::SequenceOracle(std::span<const FunctionId> sequence) {
  for (uint64_t i = 0; i < sequence.size(); ++i) positions_[sequence[i]].push_back(i);
}

double SequenceOracle::requests_until_next(FunctionId f, uint64_t current) const {
  auto it = positions_.find(f);
  if (it == positions_.end()) return std::numeric_limits<double>::infinity();
  const std::vector<uint64_t>& p = it->second;
  auto next = std::upper_bound(p.begin(), p.end(), current);
  if (next == p.end()) return std::numeric_limits<double>::infinity();
  return static_cast<double>(*next - current);
}

}  // namespace hiber::scheduler
