#include "sim/co_run.h"

#include <algorithm>
#include <cmath>

namespace hiber::sim {

void CoRun::advance(Time now) {
  const double elapsed = static_cast<double>(now - since_) / slowdown_;
  for (Entry& e : entries_) e.work_left = std::max(0.0, e.work_left - elapsed);
  since_ = now;
}

void CoRun::finishes(Time now, std::vector<Finish>* out) {
  set_.clear();
  for (const Entry& e : entries_) set_.push_back(e.intensity);
  slowdown_ = interference_ ? scheduler::co_run_slowdown(set_) : 1.0;
  for (const Entry& e : entries_) {
    out->push_back(Finish{e.request, now + std::llround(e.work_left * slowdown_)});
  }
}

void CoRun::enter(RequestId request, Duration work, scheduler::Intensity intensity, Time now,
                  std::vector<Finish>* out) {
  advance(now);
  entries_.push_back(Entry{request, static_cast<double>(std::max<Duration>(work, 0)), intensity});
  finishes(now, out);
}

void CoRun::leave(RequestId request, Time now, std::vector<Finish>* out) {
  advance(now);
  std::erase_if(entries_, [&](const Entry& e) { return e.request == request; });
  finishes(now, out);
}

}  // namespace hiber::sim
