// hiber-load's report: per-function and total counts, SLO compliance, latency percentiles,
// where the models came from and how many instances answered, as a table and as JSON. Pure, so
// tests check the arithmetic against hand-computed values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hiber::load {

// One request's outcome.
struct RequestRecord {
  uint32_t function = 0;
  int status = 0;          // HTTP status; 0: no answer (connect, send or read failed, timed out)
  double latency_ms = 0;   // from its scheduled send time to the whole answer
  double send_lag_ms = 0;  // how late it was sent (every connection busy, or a slow client)
  std::string source;      // X-Hiber-Source, empty when absent
  std::string link;        // X-Hiber-Link
  std::string node;        // X-Hiber-Node
  std::string gpu;         // X-Hiber-Gpu
  std::string instance;    // X-Hiber-Instance: the worker that answered
  std::string error;       // with status 0, why
};

struct FunctionSummary {
  std::string name;
  std::optional<double> slo_ms;
  uint64_t requests = 0;
  uint64_t ok = 0;                       // 2xx
  uint64_t on_time = 0;                  // 2xx within slo_ms (0 without an SLO)
  std::map<int, uint64_t> errors;        // non-2xx answers by status; 0: no answer
  std::optional<double> compliance_pct;  // on_time / requests, with an SLO and requests
  std::optional<double> p50_ms, p99_ms;  // over the 2xx answers
  // X-Hiber-Source / X-Hiber-Link of every answer that carries them.
  uint64_t resident = 0, peer_nvlink = 0, peer_pcie = 0, host = 0;
  uint64_t no_source = 0;  // answers without the header (errors at the router, most often)
  uint64_t instances = 0;  // distinct X-Hiber-Instance values: the workers that answered
};

struct Summary {
  std::vector<FunctionSummary> functions;
  FunctionSummary total;  // name "total"; compliance over the functions with an SLO
  double wall_s = 0;
  double max_send_lag_ms = 0;
  uint64_t late_sends = 0;  // requests sent more than 1 ms after their time
};

// The nearest-rank percentile: the smallest value with at least p of them at or below it
// (p in (0, 1]); nullopt for no values.
std::optional<double> percentile(std::vector<double> values, double p);

// `slo_ms[i]` is names[i]'s SLO (nullopt: unknown); records name functions by index.
Summary summarize(const std::vector<std::string>& names,
                  const std::vector<std::optional<double>>& slo_ms,
                  const std::vector<RequestRecord>& records, double wall_s);

// The table hiber-load prints.
std::string format_summary(const Summary& summary);
nlohmann::json summary_json(const Summary& summary);

}  // namespace hiber::load
