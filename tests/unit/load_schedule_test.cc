// hiber-load's schedule (tools/load/schedule.h): which trace rows drive which function, how a
// slice and the speedup place the requests, and the flag parsers, against hand-worked values.
#include "tools/load/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace hiber::load {
namespace {

constexpr int64_t kMinuteNs = int64_t{60} * 1'000'000'000;

sim::TraceFunction row(std::string name, std::string trigger, std::vector<uint32_t> counts) {
  sim::TraceFunction f;
  f.owner = "o";
  f.app = "a";
  f.function = std::move(name);
  f.trigger = std::move(trigger);
  f.per_minute = std::move(counts);
  return f;
}

// Requests of `function` whose send time lies in [from, to).
size_t count(const std::vector<ScheduledRequest>& s, uint32_t function, int64_t from, int64_t to) {
  return std::count_if(s.begin(), s.end(), [&](const ScheduledRequest& r) {
    return r.function == function && r.at_ns >= from && r.at_ns < to;
  });
}

const std::vector<sim::TraceFunction> kTrace = {
    row("r0", "http", {2, 1, 0}),
    row("r1", "timer", {0, 3, 1}),
    row("r2", "http", {1, 0, 4}),
};

TEST(LoadScheduleTest, FirstRowsDriveOneFunctionEachAndSpeedupCompressesTime) {
  ScheduleOptions o;
  o.minutes = 2;
  o.speedup = 4;  // a minute in 15 s
  auto s = build_schedule(kTrace, 2, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  // Row 0 -> fn 0: 2 then 1; row 1 -> fn 1: 0 then 3; row 2 unused.
  ASSERT_EQ(s->size(), 6u);
  const int64_t quarter = kMinuteNs / 4;
  EXPECT_EQ(count(*s, 0, 0, quarter), 2u);
  EXPECT_EQ(count(*s, 0, quarter, 2 * quarter), 1u);
  EXPECT_EQ(count(*s, 1, 0, quarter), 0u);
  EXPECT_EQ(count(*s, 1, quarter, 2 * quarter), 3u);
  // The times are hiber-sim's arrivals of each row (row index as the stream), divided by 4.
  for (uint32_t f = 0; f < 2; ++f) {
    auto arrivals = sim::trace_arrivals(kTrace[f], 0, 2, o.seed, f);
    ASSERT_TRUE(arrivals.ok());
    std::vector<int64_t> expected, got;
    for (auto t : *arrivals) expected.push_back(t / 4);
    for (const auto& r : *s)
      if (r.function == f) got.push_back(r.at_ns);
    EXPECT_EQ(got, expected) << "function " << f;
  }
  for (size_t i = 0; i < s->size(); ++i) {
    EXPECT_EQ((*s)[i].sequence, i);
    if (i > 0) {
      EXPECT_LE((*s)[i - 1].at_ns, (*s)[i].at_ns);
    }
  }
  // per_function numbers each function's requests 0, 1, 2 in time order.
  std::vector<uint64_t> next(2, 0);
  for (const auto& r : *s) EXPECT_EQ(r.per_function, next[r.function]++);
}

TEST(LoadScheduleTest, RowsFoldRoundRobinAndTheSliceStartsWhereAsked) {
  ScheduleOptions o;
  o.start_minute = 1;
  o.minutes = 2;
  o.speedup = 1;
  o.rows_per_function = 2;
  auto s = build_schedule(kTrace, 2, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  // Rows 0 and 2 -> fn 0: minute 1 gives 1 + 0, minute 2 gives 0 + 4. Row 1 -> fn 1: 3, then 1.
  EXPECT_EQ(count(*s, 0, 0, kMinuteNs), 1u);
  EXPECT_EQ(count(*s, 0, kMinuteNs, 2 * kMinuteNs), 4u);
  EXPECT_EQ(count(*s, 1, 0, kMinuteNs), 3u);
  EXPECT_EQ(count(*s, 1, kMinuteNs, 2 * kMinuteNs), 1u);
  EXPECT_EQ(s->size(), 9u);
}

TEST(LoadScheduleTest, HttpOnlySkipsOtherTriggers) {
  ScheduleOptions o;
  o.minutes = 3;
  o.http_only = true;
  auto s = build_schedule(kTrace, 2, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  // fn 0 <- r0 (3 requests), fn 1 <- r2 (5 requests); r1 is a timer.
  EXPECT_EQ(count(*s, 0, 0, 3 * kMinuteNs), 3u);
  EXPECT_EQ(count(*s, 1, 0, 3 * kMinuteNs), 5u);
  EXPECT_EQ(count(*s, 1, 2 * kMinuteNs, 3 * kMinuteNs), 4u);
}

TEST(LoadScheduleTest, MaxRequestsKeepsTheEarliest) {
  ScheduleOptions o;
  o.minutes = 3;
  o.rows_per_function = 3;
  auto all = build_schedule(kTrace, 1, o);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 12u);  // 3 + 4 + 5
  o.max_requests = 5;
  auto first = build_schedule(kTrace, 1, o);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ((*first)[i].at_ns, (*all)[i].at_ns);
}

TEST(LoadScheduleTest, RejectsWhatCannotBeReplayed) {
  ScheduleOptions o;
  EXPECT_FALSE(build_schedule(kTrace, 4, o).ok());  // 3 rows, 4 functions
  EXPECT_FALSE(build_schedule(kTrace, 0, o).ok());
  o.speedup = 0;
  EXPECT_FALSE(build_schedule(kTrace, 1, o).ok());
  o.speedup = 1;
  o.start_minute = 2;
  o.minutes = 2;  // minutes 2 and 3 of a 3-minute trace
  EXPECT_FALSE(build_schedule(kTrace, 1, o).ok());
  o.http_only = true;
  o.start_minute = 0;
  o.minutes = 1;
  EXPECT_FALSE(build_schedule(kTrace, 3, o).ok());  // two HTTP rows
}

TEST(LoadScheduleTest, ExpandsBodyTemplates) {
  ScheduledRequest r;
  r.sequence = 17;
  r.per_function = 4;
  EXPECT_EQ(expand_body("{k} {index}", "fn-2", 2, r), "4 2");
  EXPECT_EQ(expand_body("{function}/{n}:{k}", "fn-2", 2, r), "fn-2/17:4");
  EXPECT_EQ(expand_body("{\"x\": {n}} {other} {", "f", 0, r), "{\"x\": 17} {other} {");
  EXPECT_EQ(expand_body("", "f", 0, r), "");
}

TEST(LoadScheduleTest, ParsesFlags) {
  auto fns = parse_function_list("fn-0,fn-1");
  ASSERT_TRUE(fns.ok());
  EXPECT_EQ(*fns, (std::vector<std::string>{"fn-0", "fn-1"}));
  EXPECT_FALSE(parse_function_list("").ok());
  EXPECT_FALSE(parse_function_list("a,,b").ok());
  EXPECT_FALSE(parse_function_list("a,b,a").ok());

  auto slo = parse_slo_list("fn-0:100,fn-1:250.5");
  ASSERT_TRUE(slo.ok());
  EXPECT_EQ(slo->at("fn-0"), 100);
  EXPECT_EQ(slo->at("fn-1"), 250.5);
  EXPECT_TRUE(parse_slo_list("")->empty());
  EXPECT_FALSE(parse_slo_list("fn-0").ok());
  EXPECT_FALSE(parse_slo_list("fn-0:0").ok());
  EXPECT_FALSE(parse_slo_list("fn-0:ms").ok());

  auto e = parse_router_url("http://127.0.0.1:8080");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 8080);
  EXPECT_EQ(e->prefix, "");
  e = parse_router_url("http://router/api/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "router");
  EXPECT_EQ(e->port, 80);
  EXPECT_EQ(e->prefix, "/api");
  e = parse_router_url("http://[::1]:9000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 9000);
  EXPECT_FALSE(parse_router_url("https://x").ok());
  EXPECT_FALSE(parse_router_url("http://x:0").ok());
  EXPECT_FALSE(parse_router_url("http://:80").ok());
}

}  // namespace
}  // namespace hiber::load
