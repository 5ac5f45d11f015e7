// hiber-load's plan: which requests to send, when, to which function, with which body. Pure
// (no I/O but load_trace's file), so tests check it against hand-computed schedules.
//
// Trace rows map onto the registered functions in order: the trace's rows (after the optional
// HTTP-trigger filter) are taken first to last, and row r goes to function r % N, N functions,
// rows_per_function rows each (so the first N rows drive one function each by default). Each
// row's invocations in the slice are spread over their minutes exactly as hiber-sim spreads
// them (sim::trace_arrivals, the row's index r and the run's seed), then time is divided by the
// speedup.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "sim/azure_trace.h"

namespace hiber::load {

struct ScheduleOptions {
  int start_minute = 0;       // 0-based first minute of the slice
  int minutes = 1;            // the slice's length
  double speedup = 1;         // trace time / replay time
  int rows_per_function = 1;  // trace rows folded onto each function
  bool http_only = false;     // keep only HTTP-triggered rows
  uint64_t seed = 1;          // as hiber-sim's --seed
  uint64_t max_requests = 0;  // keep the first N requests of the slice; 0 = all
};

struct ScheduledRequest {
  int64_t at_ns = 0;          // send time, ns after the run starts
  uint32_t function = 0;      // index into the functions list
  uint64_t sequence = 0;      // 0-based position in the schedule
  uint64_t per_function = 0;  // 0-based position among its function's requests
};

// Sorted by (at_ns, function). An error when the speedup is not positive, the slice lies
// outside the trace, or the trace has fewer (kept) rows than functions.
Result<std::vector<ScheduledRequest>> build_schedule(const std::vector<sim::TraceFunction>& trace,
                                                     size_t functions,
                                                     const ScheduleOptions& options);

// A request body from a template: {function} the function's name, {index} its position in the
// functions list, {n} the request's sequence number, {k} its number among its function's
// requests. Other text, unknown braces included, stays as it is.
std::string expand_body(std::string_view tmpl, std::string_view function, size_t index,
                        const ScheduledRequest& request);

// "fn-0,fn-1": the names, in order; an error for an empty list, an empty name or a repeat.
Result<std::vector<std::string>> parse_function_list(std::string_view list);

// "fn-0:100,fn-1:250.5": SLOs in ms by function; an error for a malformed entry or a
// non-positive value.
Result<std::map<std::string, double>> parse_slo_list(std::string_view list);

// The router's address from "http://host[:port][/prefix]" (port 80 by default).
struct Endpoint {
  std::string host;
  uint16_t port = 80;
  std::string prefix;  // "" or "/prefix", without a trailing slash
};
Result<Endpoint> parse_router_url(std::string_view url);

}  // namespace hiber::load
