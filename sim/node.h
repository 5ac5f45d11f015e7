// One simulated worker node, whatever system runs it: Hiber (late binding, the real scheduler
// and pools) or one of the early-binding baselines. The simulation loop hands it its functions
// and their requests; it reports every request's outcome and its GPUs' busy time to a Recorder.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "sim/event_queue.h"
#include "sim/metrics.h"
#include "sim/workload.h"

namespace hiber::sim {

class Node {
 public:
  virtual ~Node() = default;

  // Deploys function `index` of the workload on this node.
  virtual Status add_function(uint32_t index, const SimFunction& function, Time now) = 0;
  // A request of function `index` arrives now.
  virtual void arrive(uint32_t index, Time now) = 0;
  // The run ends: whatever is still queued or running is recorded as unfinished.
  virtual void finish(Time now) = 0;
  // Counters for logs and reports, one line.
  virtual std::string summary() const = 0;
};

}  // namespace hiber::sim
