#include "scheduler/heaviness.h"

#include <limits>

namespace hiber::scheduler {

double HeavinessClassifier::ratio(double swap, double exec) {
  if (exec <= 0) return swap > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return swap / exec;
}

bool HeavinessClassifier::heavy(const HeavinessInputs& in) const {
  const bool measured = in.host_swap && in.exec && in.host_swap->samples >= options_.min_samples &&
                        in.exec->samples >= options_.min_samples;
  if (measured) return ratio(in.host_swap->value, in.exec->value) >= options_.heavy_ratio;
  if (in.heavy_hint) return *in.heavy_hint;
  if (in.swap_time_hint > 0 && in.exec_time_hint > 0)
    return ratio(static_cast<double>(in.swap_time_hint), static_cast<double>(in.exec_time_hint)) >=
           options_.heavy_ratio;
  return options_.unknown_is_heavy;
}

}  // namespace hiber::scheduler
