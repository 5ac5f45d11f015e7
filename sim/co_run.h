// The requests executing on one simulated GPU at once (spatial sharing), re-timed as they come
// and go: processor sharing at the slowdown of scheduler/interference.h.
//
// Each request brings its execution time alone (`work`). While a set S executes, each advances
// at 1 / co_run_slowdown(S) of its speed alone; when a request joins or leaves, everyone's work
// left is brought up to date at the old rate and their finish times are recomputed at the new
// one. One request alone finishes exactly `work` after it entered, so a node that never shares
// times its requests as it did before this model existed.
#pragma once

#include <vector>

#include "common/ids.h"
#include "scheduler/interference.h"
#include "scheduler/types.h"

namespace hiber::sim {

using scheduler::Duration;
using scheduler::Time;

class CoRun {
 public:
  // `interference` off: requests sharing the GPU never slow each other (an optimistic bound).
  explicit CoRun(bool interference) : interference_(interference) {}

  struct Finish {
    RequestId request;
    Time at = 0;
  };
  // `request` starts executing `work` (time alone) at `now`. Appends the finish time of every
  // request on the GPU, the new one included.
  void enter(RequestId request, Duration work, scheduler::Intensity intensity, Time now,
             std::vector<Finish>* out);
  // `request` finished (or was withdrawn) at `now`. Appends the new finish times of the others.
  void leave(RequestId request, Time now, std::vector<Finish>* out);

  size_t size() const { return entries_.size(); }
  // The slowdown the requests executing now run at.
  double slowdown() const { return slowdown_; }

 private:
  struct Entry {
    RequestId request;
    double work_left = 0;  // ns alone, as of since_
    scheduler::Intensity intensity;
  };
  void advance(Time now);
  void finishes(Time now, std::vector<Finish>* out);

  bool interference_;
  std::vector<Entry> entries_;
  Time since_ = 0;
  double slowdown_ = 1;
  std::vector<scheduler::Intensity> set_;  // finishes()' scratch
};

}  // namespace hiber::sim
