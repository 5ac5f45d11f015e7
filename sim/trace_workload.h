// A trace (sim/azure_trace.h) as hiber-sim's Workload: one SimFunction per kept row, with the
// arrivals trace_arrivals spreads over each minute.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "sim/azure_trace.h"
#include "sim/workload.h"

namespace hiber::sim {

struct TraceOptions {
  int start_minute = 0;    // 0-based first minute to replay
  int minutes = 60;        // how many
  bool http_only = false;  // keep only HTTP-triggered functions (mCache's filter)
  int max_functions = 0;   // the first N rows kept after filtering; 0 = all
  uint64_t seed = 1;
  std::vector<int> models;  // round-robin over these; empty = all eight
  Deadlines deadlines;
};

// One SimFunction per kept row (rate = its mean over the window), with its arrivals.
Result<Workload> workload_from_trace(const std::vector<TraceFunction>& trace,
                                     const TraceOptions& options);

// The inverse, for writing synthetic traces: each function's arrivals counted per minute.
std::vector<TraceFunction> trace_from_workload(const Workload& workload, int minutes);

}  // namespace hiber::sim
