// tools/top_view.h: the screen of `hiberctl top` and the table of `hiberctl functions`, from a
// fixture status (tests/router/top_view_status.json, docs/router.md's shape). Expected values
// were worked out by hand from the fixture (times with Python's datetime in UTC).
#include "tools/top_view.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace hiber::tools {
namespace {

using nlohmann::json;

json fixture() {
  std::ifstream in(std::string(HIBER_SOURCE_DIR) + "/tests/router/top_view_status.json");
  return json::parse(in);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A line with each run of blanks made one blank: the values, not the padding.
std::string squeeze(const std::string& line) {
  std::string out;
  for (char c : line) {
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += c;
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<std::string> squeezed(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& l : lines_of(text)) out.push_back(squeeze(l));
  return out;
}

// The index of the line that squeezes to `want`, or -1.
int find_line(const std::vector<std::string>& lines, const std::string& want) {
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] == want) return static_cast<int>(i);
  }
  return -1;
}

TEST(UsageBar, FillsByShare) {
  EXPECT_EQ(usage_bar(0, 100, 10), "[..........]");
  EXPECT_EQ(usage_bar(50, 100, 10), "[#####.....]");
  EXPECT_EQ(usage_bar(100, 100, 4), "[####]");
  EXPECT_EQ(usage_bar(1, 3, 3), "[#..]");
  EXPECT_EQ(usage_bar(200, 100, 4), "[####]");  // overfull shows full
  EXPECT_EQ(usage_bar(5, 0, 4), "[....]");      // no pool
}

TEST(FormatBytes, PicksTheUnit) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(512ull << 20), "512.0 MiB");
  EXPECT_EQ(format_bytes(80ull << 30), "80.0 GiB");
  EXPECT_EQ(format_bytes(3ull << 40), "3.0 TiB");
}

TEST(TopView, Screen) {
  auto text = render_top(fixture(), TopOptions{"http://127.0.0.1:8080", 10});
  ASSERT_TRUE(text.ok()) << text.status();
  const auto lines = squeezed(*text);

  EXPECT_EQ(lines[0],
            "hiber-router http://127.0.0.1:8080 2025-11-26 01:20:00 UTC 3 functions, 2 nodes, "
            "35 requests");
  EXPECT_NE(find_line(lines, "NODE n0 up backend sim queued 2 shed 7 preempted 5"), -1) << *text;
  // A router before the counters (or a node that never answered) shows 0.
  EXPECT_NE(find_line(lines, "NODE n1 DOWN backend cuda queued 0 shed 0 preempted 0"), -1) << *text;
  // 40 of 80 GiB: half of 20 cells.
  EXPECT_NE(find_line(lines, "0 H100 fn-1 [##########..........] 50.0% 40.0 GiB / 80.0 GiB 0.25"),
            -1)
      << *text;
  EXPECT_NE(find_line(lines, "resident: fn-1, resnet-big"), -1) << *text;
  EXPECT_NE(find_line(lines,
                      "1 H100 - [....................] 0.0% 0 B / 80.0 GiB 0.00 UNHEALTHY drained"),
            -1)
      << *text;
  EXPECT_NE(find_line(lines, "resident: -"), -1) << *text;

  // Sorted by requests. RPS: the router's own rate, from the first refresh on (fn-3's status,
  // from a router before "rps", has none: "-"). On time: 24 of 25, 8 of 10, none of none.
  const int header = find_line(lines,
                               "FUNCTION REQS RPS ON-TIME SLO ms P50 ms P99 ms QUEUED INST BUSY "
                               "FAILED REJECTED SHED");
  ASSERT_NE(header, -1) << *text;
  EXPECT_EQ(lines[header + 1], "resnet-big 25 10.0 96.0% 250 41.2 120.0 0 2 0 0 3 4");
  EXPECT_EQ(lines[header + 2], "fn-1 10 2.0 80.0% 100 3.1 9.8 2 1 1 1 0 0");
  EXPECT_EQ(lines[header + 3], "fn-3 0 - - 50 - - 0 0 0 0 0 0");

  const int swaps = find_line(lines, "RECENT SWAPS (2 of 2, newest first)");
  ASSERT_NE(swaps, -1) << *text;
  EXPECT_EQ(lines[swaps + 1], "TIME FUNCTION NODE GPU FROM LINK QUEUED ms");
  EXPECT_EQ(lines[swaps + 2], "01:20:00.100 fn-1 n0 0 peer GPU 1 nvlink 2.0");
  EXPECT_EQ(lines[swaps + 3], "01:19:59.250 resnet-big n0 1 host host 15.5");
  EXPECT_EQ(static_cast<int>(lines.size()), swaps + 4);
}

TEST(TopView, ColumnsAreAligned) {
  auto text = render_top(fixture(), TopOptions{"r", 10});
  ASSERT_TRUE(text.ok()) << text.status();
  const auto lines = lines_of(*text);
  // The functions table: every row's REQS value ends where the header's "REQS" ends.
  size_t header = 0;
  while (header < lines.size() && lines[header].rfind("FUNCTION", 0) != 0) ++header;
  ASSERT_LT(header + 3, lines.size());
  const size_t end = lines[header].find("REQS") + 4;
  EXPECT_EQ(lines[header + 1].substr(0, end), "resnet-big    25");
  EXPECT_EQ(lines[header + 2].substr(0, end), "fn-1          10");
  EXPECT_EQ(lines[header + 3].substr(0, end), "fn-3           0");
  for (const auto& l : lines) EXPECT_TRUE(l.empty() || l.back() != ' ') << "'" << l << "'";
}

TEST(TopView, WithoutSwapsSaysWhoseSwapsItLists) {
  json status = fixture();
  status["swaps"] = json::array();
  auto text = render_top(status, TopOptions{"r", 10});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("RECENT SWAPS: none of the requests this router started needed one"),
            std::string::npos)
      << *text;
}

TEST(TopView, SwapRowsAreCapped) {
  auto text = render_top(fixture(), TopOptions{"r", 1});
  ASSERT_TRUE(text.ok()) << text.status();
  const auto lines = squeezed(*text);
  EXPECT_NE(find_line(lines, "RECENT SWAPS (1 of 2, newest first)"), -1) << *text;
  EXPECT_EQ(lines.back(), "01:20:00.100 fn-1 n0 0 peer GPU 1 nvlink 2.0");
}

TEST(TopView, EmptyRouter) {
  auto text = render_top(json::parse(R"({"time": 0, "functions": [], "nodes": [], "swaps": []})"),
                         TopOptions{"r", 10});
  ASSERT_TRUE(text.ok()) << text.status();
  const auto lines = squeezed(*text);
  EXPECT_EQ(lines[0], "hiber-router r 1970-01-01 00:00:00 UTC 0 functions, 0 nodes, 0 requests");
  EXPECT_EQ(lines[2], "NODES: none");
  EXPECT_NE(find_line(lines, "FUNCTIONS: none registered"), -1) << *text;
  EXPECT_EQ(lines.back(), "RECENT SWAPS: none of the requests this router started needed one");
}

TEST(TopView, MalformedStatusIsAnError) {
  for (const char* bad : {R"([])", R"({"functions": 3})", R"({"functions": [{"requests": "x"}]})",
                          R"({"nodes": [{"gpus": {}}]})"}) {
    auto text = render_top(json::parse(bad), TopOptions{});
    ASSERT_FALSE(text.ok()) << bad;
    EXPECT_EQ(text.status().code(), ErrorCode::kInvalidValue) << bad;
  }
}

TEST(FunctionsView, RegistryWithNumbers) {
  const json index = json::parse(
      R"([{"name": "fn-1", "state": "READY"}, {"name": "new-fn", "state": "LOADING"},
          {"name": "resnet-big", "state": "READY"}])");
  auto text = render_functions(index, fixture());
  ASSERT_TRUE(text.ok()) << text.status();
  const auto lines = squeezed(*text);
  ASSERT_EQ(lines.size(), 4u) << *text;
  EXPECT_EQ(lines[0], "FUNCTION STATE INSTANCES REQUESTS SLO ms ON-TIME P50 ms P99 ms");
  EXPECT_EQ(lines[1], "fn-1 READY 1 10 100 80.0% 3.1 9.8");
  EXPECT_EQ(lines[2], "new-fn LOADING - - - - - -");  // registered, not yet in the status
  EXPECT_EQ(lines[3], "resnet-big READY 2 25 250 96.0% 41.2 120.0");
}

TEST(FunctionsView, Empty) {
  auto text = render_functions(json::array(), fixture());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "no functions registered\n");
  EXPECT_FALSE(render_functions(json::object(), fixture()).ok());
}

}  // namespace
}  // namespace hiber::tools
