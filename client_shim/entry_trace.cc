// HIBER_TRACE's shared half (entry_support.h): the tables the exit summary prints, and the calls
// of generated stubs, which have no table row of their own to count in.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "client_shim/entry_support.h"

namespace hiber::shim {
namespace {

struct Summary {
  std::mutex mu;
  std::vector<EntryTable*> tables;
  std::map<std::pair<std::string, std::string>, uint64_t> stub_calls;  // (library, name)
};

Summary& summary() {
  static Summary* s = new Summary;  // outlives every static destructor: printed from atexit
  return *s;
}

void print_summary() {
  Summary& s = summary();
  std::lock_guard lock(s.mu);
  struct Row {
    std::string library;
    std::string name;
    uint64_t calls;
  };
  std::vector<Row> rows;
  uint64_t total = 0;
  for (const EntryTable* table : s.tables) {
    for (size_t i = 0; i < table->size; ++i) {
      const uint64_t calls = table->counts[i].load(std::memory_order_relaxed);
      if (calls != 0) rows.push_back({table->library, table->names[i], calls});
      total += calls;
    }
  }
  for (const auto& [key, calls] : s.stub_calls) {
    rows.push_back({key.first, key.second + " (stub)", calls});
    total += calls;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return a.calls != b.calls ? a.calls > b.calls : a.name < b.name;
  });
  std::string text = "hiber trace summary: " + std::to_string(total) + " calls of " +
                     std::to_string(rows.size()) + " entry points\n";
  for (const Row& row : rows) {
    text += "  " + row.library + " " + row.name + " " + std::to_string(row.calls) + "\n";
  }
  std::fputs(text.c_str(), stderr);
}

void arm_summary() {
  static const bool armed = [] { return std::atexit(print_summary) == 0; }();
  (void)armed;
}

}  // namespace

void library_register_entry_table(EntryTable* table) {
  if (trace_mode() != TraceMode::kSummary) return;
  Summary& s = summary();
  {
    std::lock_guard lock(s.mu);
    s.tables.push_back(table);
  }
  arm_summary();
}

void library_trace_line(const std::string& line) {
  const std::string whole = line + "\n";
  std::fputs(whole.c_str(), stderr);  // one write: lines of two threads do not interleave
}

void library_trace_stub_call(const char* library, const char* name, int status) {
  switch (trace_mode()) {
    case TraceMode::kOff: return;
    case TraceMode::kCalls:
      library_trace_line(std::string("hiber trace: ") + name + "(...) -> " +
                         std::to_string(status) + " (not supported)");
      return;
    case TraceMode::kSummary: {
      Summary& s = summary();
      {
        std::lock_guard lock(s.mu);
        ++s.stub_calls[{library, name}];
      }
      arm_summary();
      return;
    }
  }
}

}  // namespace hiber::shim
