#include "tools/top_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include <nlohmann/json.hpp>

namespace hiber::tools {
namespace {

using nlohmann::json;

std::string printf_string(const char* format, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

// A field that may be absent or null: the views show "-" for it.
std::optional<double> number(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    throw json::type_error::create(302, str_cat("\"", key, "\" is not a number"), &j);
  }
  return it->get<double>();
}

uint64_t count(const json& j, const char* key) {
  auto n = number(j, key);
  return n && *n > 0 ? static_cast<uint64_t>(*n) : 0;
}

std::string text(const json& j, const char* key, const std::string& none = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return none;
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

bool flag(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

const json& array(const json& j, const char* key) {
  static const json kEmpty = json::array();
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return kEmpty;
  if (!it->is_array()) {
    throw json::type_error::create(302, str_cat("\"", key, "\" is not an array"), &j);
  }
  return *it;
}

std::string fixed(std::optional<double> v, int decimals = 1) {
  return v ? printf_string("%.*f", decimals, *v) : "-";
}

std::string percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? "-" : printf_string("%.1f%%", 100.0 * part / whole);
}

// "02:40:00.100" (UTC) for a status time in seconds since the epoch.
std::string clock_time(double seconds, bool with_date) {
  const auto whole = static_cast<std::time_t>(std::floor(seconds));
  const int ms = static_cast<int>(std::lround((seconds - std::floor(seconds)) * 1000)) % 1000;
  std::tm tm{};
  gmtime_r(&whole, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, with_date ? "%Y-%m-%d %H:%M:%S" : "%H:%M:%S", &tm);
  return with_date ? str_cat(buffer, " UTC") : printf_string("%s.%03d", buffer, ms);
}

// Columns padded to their widest cell, two spaces apart, no trailing blanks. Headers and cells
// of a right-aligned column are right-aligned.
class Table {
 public:
  Table(std::vector<std::string> header, std::string right_aligned)
      : right_(std::move(right_aligned)) {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) {
    rows_.push_back(std::move(row));
    spans_.resize(rows_.size(), false);
  }
  // A line under the previous row, starting at the second column, that no column is sized for.
  void add_note(std::string note) {
    rows_.push_back({std::move(note)});
    spans_.resize(rows_.size(), false);
    spans_.back() = true;
  }

  std::string render(const std::string& indent = "") const {
    std::vector<size_t> widths(rows_[0].size(), 0);
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (spans_[r]) continue;
      const auto& row = rows_[r];
      for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
        widths[c] = std::max(widths[c], row[c].size());
      }
    }
    std::string out;
    for (size_t r = 0; r < rows_.size(); ++r) {
      const auto& row = rows_[r];
      if (spans_[r]) {
        out += indent + std::string(widths[0] + 2, ' ') + row[0] + "\n";
        continue;
      }
      std::string line = indent;
      for (size_t c = 0; c < widths.size(); ++c) {
        const std::string cell = c < row.size() ? row[c] : "";
        const std::string pad(widths[c] - cell.size(), ' ');
        if (c > 0) line += "  ";
        line += c < right_.size() && right_[c] == 'r' ? pad + cell : cell + pad;
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> spans_ = {false};
  std::string right_;  // per column: 'r' right-aligned, anything else left
};

std::string join(const json& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += n.is_string() ? n.get<std::string>() : n.dump();
  }
  return out.empty() ? "-" : out;
}

std::string render_nodes(const json& status) {
  std::string out;
  if (array(status, "nodes").empty()) return "NODES: none\n";
  for (const auto& node : array(status, "nodes")) {
    const bool up = flag(node, "up");
    out += str_cat("NODE ", text(node, "name"), "  ", up ? "up" : "DOWN", "  backend ",
                   text(node, "backend"), "  queued ", count(node, "queued"), "  shed ",
                   count(node, "shed"), "  preempted ", count(node, "preemptions"), "\n");
    const json& gpus = array(node, "gpus");
    if (gpus.empty()) continue;
    Table t({"GPU", "NAME", "RUNNING", "POOL", "", "USED", "FRAG", "STATE"}, "rlllrrrl");
    for (const auto& gpu : gpus) {
      const uint64_t total = count(gpu, "pool_bytes"), used = count(gpu, "pool_used_bytes");
      std::string state = flag(gpu, "healthy") || !gpu.contains("healthy") ? "" : "UNHEALTHY";
      if (flag(gpu, "drained")) state += state.empty() ? "drained" : " drained";
      t.add({text(gpu, "ordinal"), text(gpu, "name"), text(gpu, "running"),
             usage_bar(used, total, 20), percent(used, total),
             str_cat(format_bytes(used), " / ", format_bytes(total)),
             fixed(number(gpu, "fragmentation"), 2), state});
      t.add_note("resident: " + join(array(gpu, "resident")));
    }
    out += t.render("  ");
  }
  return out;
}

std::string render_swaps(const json& status, size_t max_swaps) {
  const json& swaps = array(status, "swaps");
  // The router's list: requests it started whose model came from elsewhere. hiberd's own
  // counters (hiberctl status, /metrics) also count the swaps of background leases (a worker
  // starting up), which no request of the router's waited for.
  if (swaps.empty()) return "RECENT SWAPS: none of the requests this router started needed one\n";
  Table t({"TIME", "FUNCTION", "NODE", "GPU", "FROM", "LINK", "QUEUED ms"}, "lllrllr");
  size_t shown = 0;
  for (const auto& s : swaps) {
    if (shown++ == max_swaps) break;
    auto time = number(s, "time");
    std::string from = text(s, "source");
    if (auto g = number(s, "source_gpu"); g && *g >= 0) from += str_cat(" GPU ", *g);
    t.add({time ? clock_time(*time, false) : "-", text(s, "function"), text(s, "node"),
           text(s, "gpu"), from, text(s, "link"), fixed(number(s, "queued_ms"))});
  }
  return str_cat("RECENT SWAPS (", std::min(swaps.size(), max_swaps), " of ", swaps.size(),
                 ", newest first)\n", t.render("  "));
}

}  // namespace

std::string usage_bar(uint64_t used, uint64_t total, int width) {
  width = std::max(width, 0);
  int filled = 0;
  if (total > 0) {
    const double share = std::min(1.0, static_cast<double>(used) / static_cast<double>(total));
    filled = static_cast<int>(std::lround(share * width));
  }
  std::string bar(static_cast<size_t>(width) + 2, '.');
  bar.front() = '[';
  bar.back() = ']';
  std::fill_n(bar.begin() + 1, filled, '#');
  return bar;
}

std::string format_bytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return str_cat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 3) {
    v /= 1024;
    ++unit;
  }
  return printf_string("%.1f %s", v, kUnits[unit]);
}

Result<std::string> render_top(const json& status, const TopOptions& options) {
  if (!status.is_object()) return Status(ErrorCode::kInvalidValue, "the status is not an object");
  try {
    const json& functions = array(status, "functions");
    std::vector<const json*> sorted;
    uint64_t total_requests = 0;
    for (const auto& f : functions) {
      sorted.push_back(&f);
      total_requests += count(f, "requests");
    }
    std::stable_sort(sorted.begin(), sorted.end(), [](const json* a, const json* b) {
      const uint64_t ra = count(*a, "requests"), rb = count(*b, "requests");
      return ra != rb ? ra > rb : text(*a, "name") < text(*b, "name");
    });
    const auto now = number(status, "time");
    const auto plural = [](size_t n, const char* one, const char* many) {
      return str_cat(n, " ", n == 1 ? one : many);
    };
    std::string out =
        str_cat("hiber-router ", options.router, "  ", now ? clock_time(*now, true) : "-", "  ",
                plural(functions.size(), "function", "functions"), ", ",
                plural(array(status, "nodes").size(), "node", "nodes"), ", ",
                plural(total_requests, "request", "requests"), "\n\n");
    out += render_nodes(status);
    out += "\n";

    Table t({"FUNCTION", "REQS", "RPS", "ON-TIME", "SLO ms", "P50 ms", "P99 ms", "QUEUED", "INST",
             "BUSY", "FAILED", "REJECTED", "SHED"},
            "lrrrrrrrrrrrr");
    for (const json* f : sorted) {
      const std::string name = text(*f, "name");
      const uint64_t requests = count(*f, "requests");
      t.add({name, std::to_string(requests), fixed(number(*f, "rps"), 1),
             percent(count(*f, "on_time"), requests), fixed(number(*f, "slo_ms"), 0),
             fixed(number(*f, "p50_ms")), fixed(number(*f, "p99_ms")),
             std::to_string(count(*f, "queued")), std::to_string(count(*f, "instances")),
             std::to_string(count(*f, "busy")), std::to_string(count(*f, "failed")),
             std::to_string(count(*f, "rejected")), std::to_string(count(*f, "shed"))});
    }
    out += functions.empty() ? "FUNCTIONS: none registered\n" : t.render();
    out += "\n";
    out += render_swaps(status, options.max_swaps);
    return out;
  } catch (const json::exception& e) {
    return error(ErrorCode::kInvalidValue, "malformed router status: ", e.what());
  }
}

Result<std::string> render_functions(const json& index, const json& status) {
  if (!index.is_array()) {
    return Status(ErrorCode::kInvalidValue, "the repository index is not an array");
  }
  try {
    std::map<std::string, const json*> numbers;
    if (status.is_object()) {
      for (const auto& f : array(status, "functions")) numbers[text(f, "name")] = &f;
    }
    Table t({"FUNCTION", "STATE", "INSTANCES", "REQUESTS", "SLO ms", "ON-TIME", "P50 ms", "P99 ms"},
            "llrrrrrr");
    for (const auto& entry : index) {
      const std::string name = text(entry, "name");
      auto it = numbers.find(name);
      if (it == numbers.end()) {
        t.add({name, text(entry, "state"), "-", "-", "-", "-", "-", "-"});
        continue;
      }
      const json& f = *it->second;
      const uint64_t requests = count(f, "requests");
      t.add({name, text(entry, "state"), std::to_string(count(f, "instances")),
             std::to_string(requests), fixed(number(f, "slo_ms"), 0),
             percent(count(f, "on_time"), requests), fixed(number(f, "p50_ms")),
             fixed(number(f, "p99_ms"))});
      // Why its worker cannot start, while it cannot.
      if (const std::string why = text(f, "last_start_error", ""); !why.empty()) {
        t.add_note("cannot start: " + why);
      }
    }
    return index.empty() ? std::string("no functions registered\n") : t.render();
  } catch (const json::exception& e) {
    return error(ErrorCode::kInvalidValue, "malformed router answer: ", e.what());
  }
}

}  // namespace hiber::tools
