// The Azure Functions 2019 trace (Shahrad et al., ATC'20): per-minute invocation counts per
// function, one CSV file per day, rows of
//
//     HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440
//
// (the minute columns count invocations in that minute of the day). The real files are large
// and not shipped; sim/data/azure_sample.csv is a small synthetic file in the same format.
//
// Turning counts into requests follows mCache's method (notes-caching-papers.md A.3): the
// invocations of a minute are spread uniformly at random over it, from the run's seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "sim/workload.h"

namespace hiber::sim {

struct TraceFunction {
  std::string owner;
  std::string app;
  std::string function;
  std::string trigger;               // "http", "timer", "queue", "event", ...
  std::vector<uint32_t> per_minute;  // invocations in minute 1, 2, ...
};

// Parses a whole file. Every error names the line (and column) at fault: a header that is not
// HashOwner,HashApp,HashFunction,Trigger,1..N, a row with the wrong number of fields, a count
// that is not a non-negative integer.
Result<std::vector<TraceFunction>> parse_azure_trace(std::string_view csv);
Result<std::vector<TraceFunction>> load_azure_trace(const std::string& path);

// Writes functions in the same format (the synthetic sample and the speed benchmark's trace).
std::string format_azure_trace(const std::vector<TraceFunction>& functions);

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
