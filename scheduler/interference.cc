#include "scheduler/interference.h"

#include <algorithm>
#include <vector>

namespace hiber::scheduler {
namespace {

// When a request running at `slowdown` from `now` finishes.
double finish_at(Time now, Duration work_left, double slowdown) {
  return static_cast<double>(now) + static_cast<double>(work_left) * slowdown;
}

}  // namespace

double co_run_slowdown(std::span<const Intensity> set) {
  double compute = 0;
  double memory = 0;
  for (const Intensity& i : set) {
    compute += i.compute;
    memory += i.memory;
  }
  return std::max({1.0, compute, memory});
}

std::optional<double> admit_co_runner(std::span<const CoRunner> runners, const CoRunner& incoming,
                                      Time now) {
  std::vector<Intensity> before;
  for (const CoRunner& r : runners) before.push_back(r.intensity);
  const double old_slowdown = co_run_slowdown(before);
  std::vector<Intensity> after = before;
  after.push_back(incoming.intensity);
  const double slowdown = co_run_slowdown(after);
  if (finish_at(now, incoming.work_left, slowdown) > static_cast<double>(incoming.deadline))
    return std::nullopt;
  for (const CoRunner& r : runners) {
    if (incoming.work_left > r.work_left) return std::nullopt;
    const double deadline = static_cast<double>(r.deadline);
    const bool on_time_now = finish_at(now, r.work_left, old_slowdown) <= deadline;
    if (on_time_now && finish_at(now, r.work_left, slowdown) > deadline) return std::nullopt;
  }
  return slowdown;
}

}  // namespace hiber::scheduler
