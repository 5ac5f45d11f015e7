// Knowledge of the future, for the offline eviction policies (BeladyMIN, CremeBrulee-oracle).
//
// Only a simulator replaying a trace can answer; hiberd never configures these policies
// (the factory refuses them without an oracle). Distances are counted in requests, as
// CremeBrulee's "Belady boundary" B(m) is (notes-caching-papers.md B.2.3): the number of
// requests from the current one until m's next request, 1 if it is the very next, +inf if m is
// never requested again.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "scheduler/types.h"

namespace hiber::scheduler {

class FutureOracle {
 public:
  virtual ~FutureOracle() = default;
  // Requests from arrival index `current` to the next request of f after it. Arrival indices
  // count from 0 in the order the scheduler accepted requests (Scheduler numbers them; see
  // Decision::arrival_index).
  virtual double requests_until_next(FunctionId f, uint64_t current) const = 0;
};

// The oracle of a known request sequence: sequence[i] is the function of the i-th arrival.
class SequenceOracle final : public FutureOracle {
 public:
  explicit SequenceOracle(std::span<const FunctionId> sequence);
  double requests_until_next(FunctionId f, uint64_t current) const override;

 private:
  std::unordered_map<FunctionId, std::vector<uint64_t>> positions_;  // ascending
};

}  // namespace hiber::scheduler
