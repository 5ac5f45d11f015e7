#include "tools/load/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

namespace hiber::load {
namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    out.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

}  // namespace

Result<std::vector<ScheduledRequest>> build_schedule(const std::vector<sim::TraceFunction>& trace,
                                                     size_t functions,
                                                     const ScheduleOptions& options) {
  if (functions == 0) return error(ErrorCode::kInvalidValue, "no functions to send requests to");
  if (!(options.speedup > 0) || std::isinf(options.speedup))
    return error(ErrorCode::kInvalidValue, "speedup must be a positive number, got ",
                 options.speedup);
  if (options.rows_per_function < 1)
    return error(ErrorCode::kInvalidValue, "rows_per_function must be >= 1");
  std::vector<const sim::TraceFunction*> rows;
  for (const sim::TraceFunction& row : trace) {
    if (options.http_only && row.trigger != "http") continue;
    if (rows.size() >= functions * static_cast<size_t>(options.rows_per_function)) break;
    rows.push_back(&row);
  }
  if (rows.size() < functions)
    return error(ErrorCode::kInvalidValue, "the trace has ", rows.size(), " rows",
                 options.http_only ? " with an HTTP trigger" : "", "; ", functions,
                 " functions need at least as many");

  std::vector<ScheduledRequest> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    HIBER_ASSIGN_OR_RETURN(std::vector<scheduler::Time> times,
                           sim::trace_arrivals(*rows[r], options.start_minute, options.minutes,
                                               options.seed, static_cast<uint32_t>(r)));
    for (scheduler::Time t : times) {
      ScheduledRequest request;
      request.at_ns = static_cast<int64_t>(static_cast<double>(t) / options.speedup);
      request.function = static_cast<uint32_t>(r % functions);
      out.push_back(request);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ScheduledRequest& a, const ScheduledRequest& b) {
                     return a.at_ns != b.at_ns ? a.at_ns < b.at_ns : a.function < b.function;
                   });
  if (options.max_requests > 0 && out.size() > options.max_requests)
    out.resize(options.max_requests);
  std::vector<uint64_t> counts(functions, 0);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].sequence = i;
    out[i].per_function = counts[out[i].function]++;
  }
  return out;
}

std::string expand_body(std::string_view tmpl, std::string_view function, size_t index,
                        const ScheduledRequest& request) {
  std::string out;
  out.reserve(tmpl.size());
  size_t pos = 0;
  while (pos < tmpl.size()) {
    const size_t open = tmpl.find('{', pos);
    if (open == std::string_view::npos) break;
    out.append(tmpl.substr(pos, open - pos));
    const size_t close = tmpl.find('}', open);
    const std::string_view name = close == std::string_view::npos
                                      ? std::string_view()
                                      : tmpl.substr(open + 1, close - open - 1);
    if (name == "function") {
      out.append(function);
    } else if (name == "index") {
      out += std::to_string(index);
    } else if (name == "n") {
      out += std::to_string(request.sequence);
    } else if (name == "k") {
      out += std::to_string(request.per_function);
    } else {
      out += '{';  // not a placeholder: keep the brace and go on after it
      pos = open + 1;
      continue;
    }
    pos = close + 1;
  }
  if (pos < tmpl.size()) out.append(tmpl.substr(pos));
  return out;
}

Result<std::vector<std::string>> parse_function_list(std::string_view list) {
  std::vector<std::string> out;
  std::set<std::string_view> seen;
  if (list.empty()) return error(ErrorCode::kInvalidValue, "the function list is empty");
  for (std::string_view name : split(list, ',')) {
    if (name.empty()) return error(ErrorCode::kInvalidValue, "empty function name in '", list, "'");
    if (!seen.insert(name).second)
      return error(ErrorCode::kInvalidValue, "function '", name, "' is listed twice");
    out.emplace_back(name);
  }
  return out;
}

Result<std::map<std::string, double>> parse_slo_list(std::string_view list) {
  std::map<std::string, double> out;
  if (list.empty()) return out;
  for (std::string_view entry : split(list, ',')) {
    const size_t colon = entry.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return error(ErrorCode::kInvalidValue, "SLO entry '", entry, "' is not function:ms");
    const std::string_view number = entry.substr(colon + 1);
    double ms = 0;
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), ms);
    if (number.empty() || ec != std::errc() || ptr != number.data() + number.size() || !(ms > 0))
      return error(ErrorCode::kInvalidValue, "SLO entry '", entry, "': '", number,
                   "' is not a positive number of ms");
    out[std::string(entry.substr(0, colon))] = ms;
  }
  return out;
}

Result<Endpoint> parse_router_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme)
    return error(ErrorCode::kInvalidValue, "router URL '", url, "' does not start with http://");
  std::string_view rest = url.substr(kScheme.size());
  Endpoint e;
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    e.prefix = std::string(prefix);
  }
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos) {
    const std::string_view port = authority.substr(colon + 1);
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value == 0 ||
        value > 65535)
      return error(ErrorCode::kInvalidValue, "router URL '", url, "': bad port '", port, "'");
    e.port = static_cast<uint16_t>(value);
    authority = authority.substr(0, colon);
  }
  if (authority.size() >= 2 && authority.front() == '[' && authority.back() == ']')
    authority = authority.substr(1, authority.size() - 2);  // [::1]
  if (authority.empty())
    return error(ErrorCode::kInvalidValue, "router URL '", url, "' has no host");
  e.host = std::string(authority);
  return e;
}

}  // namespace hiber::load
