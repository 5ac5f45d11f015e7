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
//
// This part is pure (no simulator types) so that tools/hiber-load links it alone;
// sim/trace_workload.h turns a trace into hiber-sim's Workload.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/types.h"

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

// The arrival times of one row's invocations in minutes [start_minute, start_minute + minutes),
// in ns from the slice's start, sorted: each minute's count spread uniformly at random over it.
// Row `index` of a run with `seed` draws from its own stream, so a row's arrivals do not depend
// on the other rows. hiber-sim (workload_from_trace) and hiber-load both replay traces this way.
// An error when the row is shorter than the slice.
Result<std::vector<scheduler::Time>> trace_arrivals(const TraceFunction& row, int start_minute,
                                                    int minutes, uint64_t seed, uint32_t index);

}  // namespace hiber::sim
