// hiber-load's report (tools/load/summary.h): percentiles, SLO compliance, error and source
// counts, against values worked out by hand.
#include "tools/load/summary.h"

#include <gtest/gtest.h>

namespace hiber::load {
namespace {

TEST(LoadSummaryTest, NearestRankPercentiles) {
  std::vector<double> ten = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};
  EXPECT_EQ(percentile(ten, 0.5), 5);    // ceil(5) = 5th smallest
  EXPECT_EQ(percentile(ten, 0.99), 10);  // ceil(9.9) = 10th
  EXPECT_EQ(percentile(ten, 0.1), 1);
  EXPECT_EQ(percentile(ten, 0.11), 2);
  std::vector<double> hundred;
  for (int i = 100; i >= 1; --i) hundred.push_back(i);
  EXPECT_EQ(percentile(hundred, 0.5), 50);
  EXPECT_EQ(percentile(hundred, 0.99), 99);
  EXPECT_EQ(percentile({7}, 0.99), 7);
  EXPECT_FALSE(percentile({}, 0.5).has_value());
}

RequestRecord rec(uint32_t fn, int status, double ms, std::string source = "",
                  std::string link = "") {
  RequestRecord r;
  r.function = fn;
  r.status = status;
  r.latency_ms = ms;
  r.source = std::move(source);
  r.link = std::move(link);
  return r;
}

TEST(LoadSummaryTest, CountsComplianceAndSources) {
  // fn-a (SLO 100 ms): 200s at 20, 50, 100 (on time: at the SLO counts), 150 (late); a 503; a
  // request with no answer. fn-b (no SLO): 200s at 5 and 7.
  std::vector<RequestRecord> records = {
      rec(0, 200, 20, "resident"),
      rec(0, 200, 50, "peer", "nvlink"),
      rec(0, 200, 100, "peer", "pcie"),
      rec(0, 200, 150, "host", "host"),
      rec(0, 503, 1),
      rec(0, 0, 60000),
      rec(1, 200, 7, "resident"),
      rec(1, 200, 5, "resident"),
  };
  // fn-a was answered by workers 3 and 5, fn-b by worker 4; errors at the router name none.
  for (size_t i : {0, 1, 2}) records[i].instance = "3";
  records[3].instance = "5";
  for (size_t i : {6, 7}) records[i].instance = "4";
  records[0].send_lag_ms = 0.5;
  records[1].send_lag_ms = 3;
  Summary s = summarize({"fn-a", "fn-b"}, {100.0, std::nullopt}, records, 2.0);
  ASSERT_EQ(s.functions.size(), 2u);
  const FunctionSummary& a = s.functions[0];
  EXPECT_EQ(a.requests, 6u);
  EXPECT_EQ(a.ok, 4u);
  EXPECT_EQ(a.on_time, 3u);
  ASSERT_TRUE(a.compliance_pct.has_value());
  EXPECT_DOUBLE_EQ(*a.compliance_pct, 50.0);  // 3 of 6
  EXPECT_EQ(a.errors, (std::map<int, uint64_t>{{0, 1}, {503, 1}}));
  EXPECT_EQ(a.p50_ms, 50);   // of 20, 50, 100, 150: ceil(2) = 2nd
  EXPECT_EQ(a.p99_ms, 150);  // ceil(3.96) = 4th
  EXPECT_EQ(a.resident, 1u);
  EXPECT_EQ(a.peer_nvlink, 1u);
  EXPECT_EQ(a.peer_pcie, 1u);
  EXPECT_EQ(a.host, 1u);
  EXPECT_EQ(a.no_source, 1u);  // the 503; the unanswered one has no answer to count
  EXPECT_EQ(a.instances, 2u);

  const FunctionSummary& b = s.functions[1];
  EXPECT_EQ(b.requests, 2u);
  EXPECT_EQ(b.ok, 2u);
  EXPECT_EQ(b.on_time, 0u);
  EXPECT_FALSE(b.compliance_pct.has_value());
  EXPECT_EQ(b.p50_ms, 5);
  EXPECT_EQ(b.p99_ms, 7);
  EXPECT_EQ(b.resident, 2u);
  EXPECT_EQ(b.instances, 1u);

  const FunctionSummary& t = s.total;
  EXPECT_EQ(t.name, "total");
  EXPECT_EQ(t.requests, 8u);
  EXPECT_EQ(t.ok, 6u);
  EXPECT_DOUBLE_EQ(*t.compliance_pct, 50.0);  // over fn-a's 6 requests only
  EXPECT_EQ(t.p50_ms, 20);                    // 5 7 20 50 100 150: 3rd
  EXPECT_EQ(t.p99_ms, 150);
  EXPECT_EQ(t.resident, 3u);
  EXPECT_EQ(t.instances, 3u);
  EXPECT_EQ(s.late_sends, 1u);
  EXPECT_EQ(s.max_send_lag_ms, 3);

  const nlohmann::json j = summary_json(s);
  EXPECT_EQ(j["functions"][0]["errors"]["503"], 1);
  EXPECT_EQ(j["functions"][0]["errors"]["no_answer"], 1);
  EXPECT_EQ(j["functions"][0]["slo_compliance_pct"], 50.0);
  EXPECT_TRUE(j["functions"][1]["slo_ms"].is_null());
  EXPECT_EQ(j["functions"][0]["sources"]["peer_nvlink"], 1);
  EXPECT_EQ(j["total"]["requests"], 8);
  EXPECT_EQ(j["functions"][0]["instances"], 2);

  const std::string table = format_summary(s);
  EXPECT_NE(table.find("fn-a"), std::string::npos);
  EXPECT_NE(table.find("conn:1 503:1"), std::string::npos);
  EXPECT_NE(table.find("50.0%"), std::string::npos);
  EXPECT_NE(table.find("4.0 requests/s"), std::string::npos);
}

TEST(LoadSummaryTest, AFunctionWithoutRequestsHasNoPercentiles) {
  Summary s = summarize({"idle"}, {100.0}, {}, 1.0);
  EXPECT_EQ(s.functions[0].requests, 0u);
  EXPECT_FALSE(s.functions[0].p50_ms.has_value());
  EXPECT_FALSE(s.functions[0].compliance_pct.has_value());
  EXPECT_FALSE(s.total.compliance_pct.has_value());
}

}  // namespace
}  // namespace hiber::load
