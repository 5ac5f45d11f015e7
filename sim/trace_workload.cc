#include "sim/trace_workload.h"

#include <cstdio>

namespace hiber::sim {

Result<Workload> workload_from_trace(const std::vector<TraceFunction>& trace,
                                     const TraceOptions& options) {
  if (options.start_minute < 0 || options.minutes <= 0)
    return error(ErrorCode::kInvalidValue, "need start_minute >= 0 and minutes > 0");
  std::vector<int> models = options.models;
  if (models.empty()) {
    for (size_t i = 0; i < paper_models().size(); ++i) models.push_back(static_cast<int>(i));
  }
  Workload w;
  w.duration = static_cast<Duration>(options.minutes) * 60 * kSecond;
  std::vector<std::vector<Time>> times;
  for (const TraceFunction& row : trace) {
    if (options.http_only && row.trigger != "http") continue;
    if (options.max_functions > 0 && static_cast<int>(w.functions.size()) >= options.max_functions)
      break;
    const uint32_t index = static_cast<uint32_t>(w.functions.size());
    HIBER_ASSIGN_OR_RETURN(
        std::vector<Time> t,
        trace_arrivals(row, options.start_minute, options.minutes, options.seed, index));
    SimFunction fn;
    fn.model = models[index % models.size()];
    const Model& model = paper_models()[fn.model];
    fn.name = str_cat(row.function, "-", model.name);
    fn.slo = options.deadlines.for_model(model);
    fn.percentile = options.deadlines.percentile;
    fn.rate_per_min = static_cast<double>(t.size()) / options.minutes;
    w.functions.push_back(std::move(fn));
    times.push_back(std::move(t));
  }
  merge_arrivals(times, &w);
  return w;
}

std::vector<TraceFunction> trace_from_workload(const Workload& workload, int minutes) {
  std::vector<TraceFunction> out(workload.functions.size());
  for (size_t f = 0; f < out.size(); ++f) {
    char hash[32];
    std::snprintf(hash, sizeof(hash), "%016llx",
                  static_cast<unsigned long long>(f * 0x9e3779b97f4a7c15ULL));
    out[f].owner = str_cat("owner", f % 97);
    out[f].app = str_cat("app", f % 389);
    out[f].function = hash;
    out[f].trigger = "http";
    out[f].per_minute.assign(minutes, 0);
  }
  for (const Arrival& a : workload.arrivals) {
    const int64_t minute = a.time / (60 * kSecond);
    if (minute < minutes) ++out[a.function].per_minute[minute];
  }
  return out;
}

}  // namespace hiber::sim
