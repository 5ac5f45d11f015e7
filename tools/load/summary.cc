#include "tools/load/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace hiber::load {
namespace {

bool is_ok(int status) { return status >= 200 && status < 300; }

void count_source(const RequestRecord& r, FunctionSummary* s) {
  if (r.status == 0) return;  // nothing came back
  if (r.source == "resident") {
    ++s->resident;
  } else if (r.source == "peer") {
    // A peer copy names its link; one that does not (an older router) counts as PCIe, the
    // slower guess.
    ++(r.link == "nvlink" ? s->peer_nvlink : s->peer_pcie);
  } else if (r.source == "host") {
    ++s->host;
  } else {
    ++s->no_source;
  }
}

void add_counts(const FunctionSummary& from, FunctionSummary* to) {
  to->requests += from.requests;
  to->ok += from.ok;
  to->on_time += from.on_time;
  for (const auto& [status, n] : from.errors) to->errors[status] += n;
  to->resident += from.resident;
  to->peer_nvlink += from.peer_nvlink;
  to->peer_pcie += from.peer_pcie;
  to->host += from.host;
  to->no_source += from.no_source;
  to->instances += from.instances;  // instance numbers are the router's: none is shared
}

std::string errors_text(const std::map<int, uint64_t>& errors) {
  if (errors.empty()) return "-";
  std::string out;
  for (const auto& [status, n] : errors) {
    if (!out.empty()) out += ' ';
    out += (status == 0 ? std::string("conn") : std::to_string(status)) + ":" + std::to_string(n);
  }
  return out;
}

std::string number(const std::optional<double>& v, const char* format) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, *v);
  return buf;
}

nlohmann::json function_json(const FunctionSummary& s) {
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [status, n] : s.errors)
    errors[status == 0 ? std::string("no_answer") : std::to_string(status)] = n;
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
  };
  return {{"name", s.name},
          {"slo_ms", opt(s.slo_ms)},
          {"requests", s.requests},
          {"ok", s.ok},
          {"errors", errors},
          {"on_time", s.on_time},
          {"slo_compliance_pct", opt(s.compliance_pct)},
          {"p50_ms", opt(s.p50_ms)},
          {"p99_ms", opt(s.p99_ms)},
          {"sources",
           {{"resident", s.resident},
            {"peer_nvlink", s.peer_nvlink},
            {"peer_pcie", s.peer_pcie},
            {"host", s.host},
            {"none", s.no_source}}},
          {"instances", s.instances}};
}

}  // namespace

std::optional<double> percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p * static_cast<double>(values.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(index, values.size() - 1)];
}

Summary summarize(const std::vector<std::string>& names,
                  const std::vector<std::optional<double>>& slo_ms,
                  const std::vector<RequestRecord>& records, double wall_s) {
  Summary out;
  out.wall_s = wall_s;
  out.functions.resize(names.size());
  std::vector<std::vector<double>> latencies(names.size());
  std::vector<std::set<std::string>> instances(names.size());
  std::vector<double> all_latencies;
  for (size_t i = 0; i < names.size(); ++i) {
    out.functions[i].name = names[i];
    if (i < slo_ms.size()) out.functions[i].slo_ms = slo_ms[i];
  }
  for (const RequestRecord& r : records) {
    if (r.function >= names.size()) continue;
    FunctionSummary& s = out.functions[r.function];
    ++s.requests;
    if (is_ok(r.status)) {
      ++s.ok;
      latencies[r.function].push_back(r.latency_ms);
      all_latencies.push_back(r.latency_ms);
      if (s.slo_ms && r.latency_ms <= *s.slo_ms) ++s.on_time;
    } else {
      ++s.errors[r.status];
    }
    count_source(r, &s);
    if (!r.instance.empty()) instances[r.function].insert(r.instance);
    out.max_send_lag_ms = std::max(out.max_send_lag_ms, r.send_lag_ms);
    if (r.send_lag_ms > 1.0) ++out.late_sends;
  }
  out.total.name = "total";
  uint64_t slo_requests = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    FunctionSummary& s = out.functions[i];
    s.instances = instances[i].size();
    s.p50_ms = percentile(latencies[i], 0.50);
    s.p99_ms = percentile(latencies[i], 0.99);
    if (s.slo_ms && s.requests > 0)
      s.compliance_pct = 100.0 * static_cast<double>(s.on_time) / static_cast<double>(s.requests);
    if (s.slo_ms) slo_requests += s.requests;
    add_counts(s, &out.total);
  }
  if (slo_requests > 0)
    out.total.compliance_pct =
        100.0 * static_cast<double>(out.total.on_time) / static_cast<double>(slo_requests);
  out.total.p50_ms = percentile(all_latencies, 0.50);
  out.total.p99_ms = percentile(all_latencies, 0.99);
  return out;
}

std::string format_summary(const Summary& summary) {
  size_t width = 8;
  for (const FunctionSummary& s : summary.functions) width = std::max(width, s.name.size());
  std::string out;
  char line[512];
  auto row = [&](const FunctionSummary& s) {
    std::snprintf(
        line, sizeof(line),
        "%-*s %8llu %8llu  %-14s %7s %8s %9s %9s %8llu %11llu %9llu %6llu %9llu\n",
        static_cast<int>(width), s.name.c_str(), static_cast<unsigned long long>(s.requests),
        static_cast<unsigned long long>(s.ok), errors_text(s.errors).c_str(),
        number(s.slo_ms, "%.0f").c_str(), number(s.compliance_pct, "%.1f%%").c_str(),
        number(s.p50_ms, "%.2f").c_str(), number(s.p99_ms, "%.2f").c_str(),
        static_cast<unsigned long long>(s.resident), static_cast<unsigned long long>(s.peer_nvlink),
        static_cast<unsigned long long>(s.peer_pcie), static_cast<unsigned long long>(s.host),
        static_cast<unsigned long long>(s.instances));
    out += line;
  };
  std::snprintf(line, sizeof(line), "%-*s %8s %8s  %-14s %7s %8s %9s %9s %8s %11s %9s %6s %9s\n",
                static_cast<int>(width), "function", "requests", "ok", "errors", "slo_ms",
                "on-time", "p50_ms", "p99_ms", "resident", "peer/nvlink", "peer/pcie", "host",
                "instances");
  out += line;
  for (const FunctionSummary& s : summary.functions) row(s);
  row(summary.total);
  std::snprintf(
      line, sizeof(line), "%.2f s, %.1f requests/s", summary.wall_s,
      summary.wall_s > 0 ? static_cast<double>(summary.total.requests) / summary.wall_s : 0.0);
  out += line;
  if (summary.late_sends > 0) {
    std::snprintf(line, sizeof(line),
                  "; %llu requests sent over 1 ms late (max %.1f ms): more --connections?",
                  static_cast<unsigned long long>(summary.late_sends), summary.max_send_lag_ms);
    out += line;
  }
  out += "\n";
  return out;
}

nlohmann::json summary_json(const Summary& summary) {
  nlohmann::json functions = nlohmann::json::array();
  for (const FunctionSummary& s : summary.functions) functions.push_back(function_json(s));
  return {{"functions", functions},
          {"total", function_json(summary.total)},
          {"wall_s", summary.wall_s},
          {"late_sends", summary.late_sends},
          {"max_send_lag_ms", summary.max_send_lag_ms}};
}

}  // namespace hiber::load
