#include "sim/azure_trace.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "scheduler/random.h"

namespace hiber::sim {
namespace {

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(line.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

}  // namespace

Result<std::vector<TraceFunction>> parse_azure_trace(std::string_view csv) {
  std::vector<TraceFunction> out;
  size_t line_no = 0;
  size_t minutes = 0;
  size_t pos = 0;
  while (pos < csv.size()) {
    size_t end = csv.find('\n', pos);
    if (end == std::string_view::npos) end = csv.size();
    std::string_view line = csv.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::vector<std::string_view> fields = split_fields(line);
    if (line_no == 1) {
      static constexpr std::string_view kHead[] = {"HashOwner", "HashApp", "HashFunction",
                                                   "Trigger"};
      if (fields.size() < 5)
        return error(ErrorCode::kInvalidValue, "line 1: header has ", fields.size(),
                     " fields; need HashOwner,HashApp,HashFunction,Trigger,1..N");
      for (size_t i = 0; i < 4; ++i) {
        if (fields[i] != kHead[i])
          return error(ErrorCode::kInvalidValue, "line 1, column ", i + 1, ": expected '", kHead[i],
                       "', found '", fields[i], "'");
      }
      for (size_t i = 4; i < fields.size(); ++i) {
        if (fields[i] != std::to_string(i - 3))
          return error(ErrorCode::kInvalidValue, "line 1, column ", i + 1, ": expected minute ",
                       i - 3, ", found '", fields[i], "'");
      }
      minutes = fields.size() - 4;
      continue;
    }
    if (fields.size() != minutes + 4)
      return error(ErrorCode::kInvalidValue, "line ", line_no, ": ", fields.size(),
                   " fields, the header has ", minutes + 4);
    TraceFunction f;
    f.owner = std::string(fields[0]);
    f.app = std::string(fields[1]);
    f.function = std::string(fields[2]);
    f.trigger = std::string(fields[3]);
    if (f.function.empty())
      return error(ErrorCode::kInvalidValue, "line ", line_no, ": empty HashFunction");
    f.per_minute.resize(minutes);
    for (size_t m = 0; m < minutes; ++m) {
      std::string_view field = fields[m + 4];
      uint32_t count = 0;
      auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), count);
      if (field.empty() || ec != std::errc() || ptr != field.data() + field.size())
        return error(ErrorCode::kInvalidValue, "line ", line_no, ", column ", m + 5,
                     ": invocation count '", field, "' is not a non-negative integer");
      f.per_minute[m] = count;
    }
    out.push_back(std::move(f));
  }
  if (line_no == 0) return error(ErrorCode::kInvalidValue, "empty trace: no header");
  return out;
}

Result<std::vector<TraceFunction>> load_azure_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(ErrorCode::kFileNotFound, path, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  Result<std::vector<TraceFunction>> parsed = parse_azure_trace(text.str());
  if (!parsed.ok()) return parsed.status().with_context(path);
  return parsed;
}

std::string format_azure_trace(const std::vector<TraceFunction>& functions) {
  size_t minutes = 0;
  for (const TraceFunction& f : functions) minutes = std::max(minutes, f.per_minute.size());
  std::string out = "HashOwner,HashApp,HashFunction,Trigger";
  for (size_t m = 1; m <= minutes; ++m) {
    out += ',';
    out += std::to_string(m);
  }
  out += "\n";
  for (const TraceFunction& f : functions) {
    out += f.owner + "," + f.app + "," + f.function + "," + f.trigger;
    for (size_t m = 0; m < minutes; ++m) {
      out += ',';
      out += std::to_string(m < f.per_minute.size() ? f.per_minute[m] : 0);
    }
    out += "\n";
  }
  return out;
}

Result<std::vector<scheduler::Time>> trace_arrivals(const TraceFunction& row, int start_minute,
                                                    int minutes, uint64_t seed, uint32_t index) {
  using scheduler::kSecond;
  using scheduler::Time;
  if (start_minute < 0 || minutes <= 0)
    return error(ErrorCode::kInvalidValue, "need start_minute >= 0 and minutes > 0");
  if (static_cast<size_t>(start_minute + minutes) > row.per_minute.size())
    return error(ErrorCode::kInvalidValue, "the trace has ", row.per_minute.size(),
                 " minutes; asked for minutes [", start_minute, ", ", start_minute + minutes, ")");
  scheduler::Rng rng(seed * 0x9e3779b97f4a7c15ULL + index + 1);
  std::vector<Time> t;
  for (int m = 0; m < minutes; ++m) {
    const uint32_t count = row.per_minute[start_minute + m];
    const Time minute_start = static_cast<Time>(m) * 60 * kSecond;
    const size_t first = t.size();
    for (uint32_t i = 0; i < count; ++i)
      t.push_back(minute_start + static_cast<Time>(rng.uniform(60 * kSecond)));
    std::sort(t.begin() + first, t.end());
  }
  return t;
}

}  // namespace hiber::sim
