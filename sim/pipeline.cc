#include "sim/pipeline.h"

#include <algorithm>
#include <cmath>

namespace hiber::sim {

PipelinedRun::PipelinedRun(Time start, uint64_t bytes, Duration exec, uint64_t group_bytes)
    : bytes_(static_cast<double>(bytes)),
      exec_(static_cast<double>(exec)),
      group_(static_cast<double>(std::min(group_bytes, bytes))),
      last_t_(static_cast<double>(start)),
      last_b_(0),
      bound_(static_cast<double>(start)) {}

double PipelinedRun::exec_at(double usable_bytes) const {
  if (bytes_ <= 0) return 0;
  return exec_ * (1.0 - usable_bytes / bytes_);
}

void PipelinedRun::observe(Time t, double bytes_arrived) {
  const double tt = static_cast<double>(t);
  const double b = std::min(bytes_arrived, bytes_);
  // The point where the first group is complete, if it lies on this piece.
  if (last_b_ < group_ && b >= group_ && b > last_b_) {
    const double crossing = last_t_ + (group_ - last_b_) * (tt - last_t_) / (b - last_b_);
    bound_ = std::max(bound_, crossing + exec_);
  }
  if (b >= group_ && b < bytes_) bound_ = std::max(bound_, tt + exec_at(b - group_));
  last_t_ = tt;
  last_b_ = b;
}

Time PipelinedRun::finish(Time transfer_end) {
  observe(transfer_end, bytes_);
  // Everything has arrived: only the last group's computation can remain.
  const double end = std::max(bound_, static_cast<double>(transfer_end) + exec_ * group_ / bytes_);
  return std::max(transfer_end, static_cast<Time>(std::llround(end)));
}

Duration PipelinedRun::constant_rate(uint64_t bytes, Duration exec, uint64_t group_bytes,
                                     double bytes_per_ns) {
  if (bytes == 0) return exec;
  const double s = static_cast<double>(bytes);
  const double g = static_cast<double>(std::min(group_bytes, bytes));
  const double e = static_cast<double>(exec);
  return static_cast<Duration>(
      std::llround(std::max(g / bytes_per_ns + e, s / bytes_per_ns + e * g / s)));
}

}  // namespace hiber::sim
