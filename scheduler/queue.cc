// What the queue policies share: option checks and the RRC arithmetic and threshold rule.
#include "scheduler/queue.h"

#include <algorithm>
#include <cmath>

namespace hiber::scheduler {

Status validate(const QueueOptions& options) {
  if (options.threshold_refresh < 0)
    return error(ErrorCode::kInvalidValue, "queue: threshold_refresh ", options.threshold_refresh,
                 " is negative");
  if (!(options.target_utilisation > 0 && options.target_utilisation <= 1))
    return error(ErrorCode::kInvalidValue, "queue: target_utilisation ", options.target_utilisation,
                 " is not in (0, 1]");
  if (!(options.gshare_redundancy >= 0 && std::isfinite(options.gshare_redundancy)))
    return error(ErrorCode::kInvalidValue, "queue: gshare_redundancy ", options.gshare_redundancy,
                 " is not a finite number >= 0");
  return Status();
}

double required_request_count(double p, uint64_t n, uint64_t m) {
  if (n == 0) return 0;
  return (p * static_cast<double>(n) - static_cast<double>(m)) / (1 - p);
}

double function_rrc(const FunctionTable& functions, FunctionIndex i, Time now) {
  const WindowTotals totals = functions.stats(i).window.totals(now);
  return required_request_count(functions.spec(i).tail_percentile, totals.completions,
                                totals.on_time);
}

RrcThreshold rrc_threshold(std::vector<RrcDemand>& functions, double capacity) {
  double total = 0;
  for (const RrcDemand& f : functions) total += f.demand;
  if (total <= capacity) return RrcThreshold{};  // everything fits: no need to order anything
  // Under overload: the longest prefix in (RRC, id) order whose demand fits, found by weighted
  // quickselect (expected O(F)) rather than a sort: split around the middle element, keep the
  // lower part whole if it fits and go on in the upper part, else go into the lower part.
  auto before = [](const RrcDemand& a, const RrcDemand& b) {
    return a.rrc != b.rrc ? a.rrc < b.rrc : a.id < b.id;
  };
  RrcThreshold threshold;
  threshold.everyone = false;
  const RrcDemand* last = nullptr;  // the greatest admitted so far
  auto lo = functions.begin();
  auto hi = functions.end();
  double budget = capacity;
  while (lo != hi) {
    auto mid = lo + (hi - lo) / 2;
    std::nth_element(lo, mid, hi, before);
    double lower = 0;
    for (auto it = lo; it != mid; ++it) lower += it->demand;
    if (lower > budget) {
      hi = mid;
      continue;
    }
    budget -= lower;
    if (lo != mid) last = &*std::max_element(lo, mid, before);
    if (mid->demand > budget) break;
    budget -= mid->demand;
    last = &*mid;
    lo = mid + 1;
  }
  if (last != nullptr) {
    threshold.rrc = last->rrc;
    threshold.id = last->id;
  }
  return threshold;
}

}  // namespace hiber::scheduler
