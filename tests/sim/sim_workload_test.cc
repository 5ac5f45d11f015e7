// Workloads: the synthetic generator (Fig. 2 popularity, Poisson and bursty arrivals), the
// Azure Functions trace format, and the cluster's balancing rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/balancer.h"
#include "sim/trace_workload.h"
#include "sim/workload.h"

namespace hiber::sim {
namespace {

TEST(Popularity, PassesThroughFigure2sTwoPoints) {
  const PopularityModel p;
  EXPECT_NEAR(p.quantile_of(1.0), 0.85, 1e-3);   // 85% at most once a minute
  EXPECT_NEAR(p.quantile_of(60.0), 0.97, 1e-3);  // 97% at most once a second
  EXPECT_NEAR(p.rate_at(p.quantile_of(7.0)), 7.0, 1e-6);
  EXPECT_NEAR(normal_quantile(0.975), 1.959964, 1e-6);
}

TEST(Synthetic, SameSeedSameWorkloadAndRatesInTheWindow) {
  SyntheticOptions o;
  o.functions = 50;
  o.duration = 600 * kSecond;
  o.seed = 7;
  Result<Workload> a = synthetic_workload(o);
  Result<Workload> b = synthetic_workload(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->arrivals.size(), b->arrivals.size());
  for (size_t i = 0; i < a->arrivals.size(); ++i) {
    EXPECT_EQ(a->arrivals[i].time, b->arrivals[i].time);
    EXPECT_EQ(a->arrivals[i].function, b->arrivals[i].function);
  }
  o.seed = 8;
  Result<Workload> c = synthetic_workload(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->arrivals.size(), c->arrivals.size());
  for (size_t f = 0; f < a->functions.size(); ++f) {
    const SimFunction& fn = a->functions[f];
    EXPECT_GE(fn.rate_per_min, 5.0);
    EXPECT_LE(fn.rate_per_min, 30.0);
    EXPECT_EQ(fn.model, static_cast<int>(f % 8)) << "round-robin";
    EXPECT_EQ(fn.slo, fn.model == 7 ? 200 * kMillisecond : 80 * kMillisecond);
  }
  EXPECT_TRUE(std::is_sorted(a->arrivals.begin(), a->arrivals.end(),
                             [](const Arrival& x, const Arrival& y) { return x.time < y.time; }));
}

TEST(Synthetic, AddingFunctionsLeavesTheOthersArrivalsAlone) {
  SyntheticOptions o;
  o.functions = 10;
  Result<Workload> small = synthetic_workload(o);
  o.functions = 20;
  Result<Workload> large = synthetic_workload(o);
  ASSERT_TRUE(small.ok() && large.ok());
  auto times_of = [](const Workload& w, uint32_t f) {
    std::vector<Time> t;
    for (const Arrival& a : w.arrivals) {
      if (a.function == f) t.push_back(a.time);
    }
    return t;
  };
  for (uint32_t f = 0; f < 10; ++f) {
    EXPECT_EQ(small->functions[f].rate_per_min, large->functions[f].rate_per_min);
    EXPECT_EQ(times_of(*small, f), times_of(*large, f)) << "function " << f;
  }
}

// Per-minute counts of a long arrival sequence: their mean and variance / mean.
std::pair<double, double> minute_counts(const std::vector<Time>& times, int minutes) {
  std::vector<double> counts(minutes, 0);
  for (Time t : times) counts[t / (60 * kSecond)] += 1;
  double mean = 0;
  for (double c : counts) mean += c / minutes;
  double var = 0;
  for (double c : counts) var += (c - mean) * (c - mean) / minutes;
  return {mean, var / mean};
}

TEST(Synthetic, PoissonAndBurstyArrivalsKeepTheMeanRateButNotTheSpread) {
  const int minutes = 2000;
  const Duration duration = minutes * 60 * kSecond;
  auto [poisson_mean, poisson_dispersion] =
      minute_counts(generate_arrivals(10, duration, ArrivalPattern::kPoisson, {}, 3), minutes);
  auto [bursty_mean, bursty_dispersion] =
      minute_counts(generate_arrivals(10, duration, ArrivalPattern::kBursty, {}, 3), minutes);
  EXPECT_NEAR(poisson_mean, 10, 0.3);
  EXPECT_NEAR(bursty_mean, 10, 1.0);
  EXPECT_NEAR(poisson_dispersion, 1.0, 0.15);  // Poisson: variance = mean
  EXPECT_GT(bursty_dispersion, 3.0);           // bursts: far more spread
}

TEST(Synthetic, RefusesBadOptions) {
  SyntheticOptions o;
  o.functions = 0;
  EXPECT_EQ(synthetic_workload(o).status().code(), ErrorCode::kInvalidValue);
  o.functions = 4;
  o.min_rate_per_min = 30;
  o.max_rate_per_min = 5;
  EXPECT_EQ(synthetic_workload(o).status().code(), ErrorCode::kInvalidValue);
  o.min_rate_per_min = 5;
  o.max_rate_per_min = 30;
  o.models = {8};
  EXPECT_EQ(synthetic_workload(o).status().code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(parse_arrival_pattern("sinusoidal").ok());
}

constexpr char kTrace[] =
    "HashOwner,HashApp,HashFunction,Trigger,1,2,3\n"
    "o1,a1,f1,http,2,0,1\n"
    "o1,a1,f2,timer,1,1,1\r\n"
    "o2,a2,f3,http,0,0,5\n";

TEST(AzureTrace, ParsesPerMinuteCounts) {
  Result<std::vector<TraceFunction>> t = parse_azure_trace(kTrace);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].function, "f1");
  EXPECT_EQ((*t)[1].trigger, "timer");
  EXPECT_EQ((*t)[2].per_minute, (std::vector<uint32_t>{0, 0, 5}));
  // Written back, it reads the same.
  Result<std::vector<TraceFunction>> again = parse_azure_trace(format_azure_trace(*t));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[1].per_minute, (*t)[1].per_minute);
}

TEST(AzureTrace, SpreadsEachMinutesInvocationsOverThatMinute) {
  Result<std::vector<TraceFunction>> t = parse_azure_trace(kTrace);
  ASSERT_TRUE(t.ok());
  TraceOptions o;
  o.minutes = 3;
  o.http_only = true;
  Result<Workload> w = workload_from_trace(*t, o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->functions.size(), 2u);  // the timer function is left out
  EXPECT_EQ(w->arrivals.size(), 8u);   // 2 + 1 + 5
  EXPECT_NEAR(w->functions[1].rate_per_min, 5.0 / 3, 1e-9);
  int f3_in_minute_3 = 0;
  for (const Arrival& a : w->arrivals) {
    if (a.function == 1) {
      EXPECT_GE(a.time, 120 * kSecond);
      EXPECT_LT(a.time, 180 * kSecond);
      ++f3_in_minute_3;
    }
  }
  EXPECT_EQ(f3_in_minute_3, 5);
  o.start_minute = 2;
  o.minutes = 2;
  EXPECT_EQ(workload_from_trace(*t, o).status().code(), ErrorCode::kInvalidValue);
}

TEST(AzureTrace, NamesTheLineOfAMalformedRow) {
  Result<std::vector<TraceFunction>> bad_header =
      parse_azure_trace("Owner,App,Function,Trigger,1\n");
  ASSERT_FALSE(bad_header.ok());
  EXPECT_NE(bad_header.status().message().find("line 1"), std::string::npos);
  Result<std::vector<TraceFunction>> short_row =
      parse_azure_trace("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1\n");
  ASSERT_FALSE(short_row.ok());
  EXPECT_NE(short_row.status().message().find("line 2"), std::string::npos);
  Result<std::vector<TraceFunction>> negative =
      parse_azure_trace("HashOwner,HashApp,HashFunction,Trigger,1\no,a,f,http,-3\n");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("column 5"), std::string::npos);
  EXPECT_FALSE(parse_azure_trace("").ok());
  EXPECT_EQ(load_azure_trace("/nonexistent/trace.csv").status().code(), ErrorCode::kFileNotFound);
}

TEST(AzureTrace, TheShippedSampleIsAFullDayInTheFormat) {
  Result<std::vector<TraceFunction>> t =
      load_azure_trace(std::string(HIBER_SOURCE_DIR) + "/sim/data/azure_sample.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_FALSE(t->empty());
  for (const TraceFunction& f : *t) EXPECT_EQ(f.per_minute.size(), 1440u);
}

TEST(Balancer, PutsEachFunctionOnTheLeastLoadedNode) {
  // Expected loads (rate/60 x exec): resnet50 at 60 r/m -> 0.009, bertqa at 60 r/m -> 0.043,
  // resnet50 at 120 r/m -> 0.018, resnet50 at 60 r/m -> 0.009.
  const int resnet50 = *find_model("resnet50");
  const int bertqa = *find_model("bertqa");
  std::vector<SimFunction> f(4);
  f[0] = {"a", resnet50, 60, 80 * kMillisecond, 0.98};
  f[1] = {"b", bertqa, 60, 200 * kMillisecond, 0.98};
  f[2] = {"c", resnet50, 120, 80 * kMillisecond, 0.98};
  f[3] = {"d", resnet50, 60, 80 * kMillisecond, 0.98};
  EXPECT_NEAR(expected_load(f[1]), 0.043, 1e-12);
  // a -> node 0 (tie, lower index); b -> node 1 (0 < 0.009); c -> node 0 (0.009 < 0.043);
  // d -> node 0 (0.027 < 0.043).
  EXPECT_EQ(balance_functions(f, 2), (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ(balance_functions(f, 1), (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace hiber::sim
