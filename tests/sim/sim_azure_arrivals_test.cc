// The Azure-shaped arrival generator (sim/azure_arrivals.h): fitted to the per-minute statistics
// of a trace, its counts reproduce them over a long run. The statistics are computed here with
// the test's own code, from per-minute counts made by other generators.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sim/azure_arrivals.h"
#include "sim/workload.h"

namespace hiber::sim {
namespace {

struct Stats {
  double mean = 0, cv = 0, idle = 0, lag1 = 0;
};

// Mean, coefficient of variation, idle share and lag-1 autocorrelation, written out plainly.
Stats stats_of(const std::vector<double>& c) {
  const double n = static_cast<double>(c.size());
  Stats s;
  for (double x : c) s.mean += x;
  s.mean /= n;
  double ss = 0, cross = 0, idle = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    ss += (c[i] - s.mean) * (c[i] - s.mean);
    if (i > 0) cross += (c[i] - s.mean) * (c[i - 1] - s.mean);
    if (c[i] == 0) idle += 1;
  }
  s.cv = std::sqrt(ss / n) / s.mean;
  s.idle = idle / n;
  s.lag1 = (cross / (n - 1)) / (ss / n);
  return s;
}

std::vector<double> per_minute(const std::vector<Time>& times, int minutes) {
  std::vector<double> c(minutes, 0);
  for (Time t : times) c[t / (60 * kSecond)] += 1;
  return c;
}

// Fits the target's statistics at its mean, generates `minutes` of arrivals and checks that
// their statistics match the target's.
void expect_reproduces(const Stats& target, int minutes, uint64_t seed) {
  MinuteStats t;
  t.cv = target.cv;
  t.idle_share = target.idle;
  t.lag1 = target.lag1;
  Result<RateProcess> shape = fit_rate_process(t, target.mean);
  ASSERT_TRUE(shape.ok()) << shape.status().message();
  scheduler::Rng rng(seed);
  const std::vector<Time> times =
      azure_arrivals(*shape, target.mean, static_cast<Duration>(minutes) * 60 * kSecond, rng);
  const Stats got = stats_of(per_minute(times, minutes));
  SCOPED_TRACE(::testing::Message()
               << "target cv " << target.cv << " idle " << target.idle << " lag1 " << target.lag1
               << "; got cv " << got.cv << " idle " << got.idle << " lag1 " << got.lag1);
  // Four standard errors of a mean of correlated counts (AR(1) approximation).
  const double mean_error =
      4 * target.cv * target.mean * std::sqrt((1 + target.lag1) / (1 - target.lag1) / minutes);
  EXPECT_NEAR(got.mean, target.mean, mean_error);
  EXPECT_NEAR(got.cv, target.cv, 0.08 * target.cv);
  EXPECT_NEAR(got.idle, target.idle, 0.02);
  EXPECT_NEAR(got.lag1, target.lag1, 0.05);
}

TEST(AzureArrivals, ReproducesTheStatisticsOfAnOnOffTrace) {
  // A "trace" from the on/off generator: 20 s bursts every 2 minutes on average.
  constexpr int kMinutes = 20000;
  const std::vector<Time> trace =
      generate_arrivals(12, static_cast<Duration>(kMinutes) * 60 * kSecond, ArrivalPattern::kBursty,
                        BurstOptions{}, /*seed=*/5);
  const Stats target = stats_of(per_minute(trace, kMinutes));
  ASSERT_GT(target.idle, 0.2);  // a bursty trace, far from Poisson's e^-12
  ASSERT_GT(target.cv, 1.0);
  expect_reproduces(target, 40000, 11);
}

TEST(AzureArrivals, ReproducesTheStatisticsOfATwoRegimeTrace) {
  // A "trace" that stays quiet (1/min) or busy (40/min) for geometric stretches of 10 minutes.
  scheduler::Rng rng(3);
  std::vector<double> counts;
  bool busy = false;
  for (int m = 0; m < 30000; ++m) {
    if (rng.uniform_double() < 0.1) busy = rng.uniform_double() < 0.3;
    const double rate = busy ? 40 : 1;
    double n = 0;  // Poisson by exponential gaps within the minute
    for (double t = -std::log(1 - rng.uniform_double()) / rate; t < 1;
         t += -std::log(1 - rng.uniform_double()) / rate)
      n += 1;
    counts.push_back(n);
  }
  const Stats target = stats_of(counts);
  expect_reproduces(target, 60000, 12);
}

TEST(AzureArrivals, ReproducesItsDefaultTargets) {
  scheduler::Rng draw(9);
  for (double mean : {5.0, 12.0, 30.0}) {
    const MinuteStats t = default_burst_target(mean, draw);
    SCOPED_TRACE(::testing::Message() << "mean " << mean << " cv " << t.cv << " idle "
                                      << t.idle_share << " lag1 " << t.lag1);
    expect_reproduces(Stats{mean, t.cv, t.idle_share, t.lag1}, 60000, 13);
  }
}

TEST(AzureArrivals, SameMeanRateAsPoissonAndSeeded) {
  SyntheticOptions o;
  o.functions = 200;
  o.duration = 600 * 60 * kSecond;
  o.seed = 4;
  Result<Workload> poisson = synthetic_workload(o);
  o.pattern = ArrivalPattern::kAzure;
  Result<Workload> azure = synthetic_workload(o);
  Result<Workload> again = synthetic_workload(o);
  o.seed = 5;
  Result<Workload> other = synthetic_workload(o);
  ASSERT_TRUE(poisson.ok() && azure.ok() && again.ok() && other.ok());
  double expected = 0;
  for (size_t f = 0; f < azure->functions.size(); ++f) {
    EXPECT_EQ(azure->functions[f].rate_per_min, poisson->functions[f].rate_per_min);
    expected += azure->functions[f].rate_per_min * 600;
  }
  EXPECT_NEAR(static_cast<double>(azure->arrivals.size()), expected, 0.04 * expected);
  EXPECT_NEAR(static_cast<double>(poisson->arrivals.size()), expected, 0.01 * expected);
  ASSERT_EQ(azure->arrivals.size(), again->arrivals.size());
  for (size_t i = 0; i < azure->arrivals.size(); ++i) {
    ASSERT_EQ(azure->arrivals[i].time, again->arrivals[i].time);
    ASSERT_EQ(azure->arrivals[i].function, again->arrivals[i].function);
  }
  EXPECT_NE(azure->arrivals.size(), other->arrivals.size());
}

TEST(AzureArrivals, PoissonSpreadOrLessFitsPoisson) {
  MinuteStats t;
  t.cv = 0.1;  // below Poisson's 1/sqrt(10)
  Result<RateProcess> p = fit_rate_process(t, 10);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->on_share, 1);
  EXPECT_EQ(p->sigma, 0);
}

TEST(AzureArrivals, BadInputIsAnError) {
  MinuteStats t;
  t.cv = 2;
  EXPECT_FALSE(fit_rate_process(t, 0).ok());
  EXPECT_FALSE(fit_rate_process(t, std::nan("")).ok());
  t.idle_share = 1;
  EXPECT_FALSE(fit_rate_process(t, 5).ok());
  t.idle_share = 0.2;
  t.lag1 = 1;
  EXPECT_FALSE(fit_rate_process(t, 5).ok());
  std::vector<TraceFunction> rows(1);
  rows[0].function = std::string("f");  // not = "f": GCC 12 -Wrestrict false positive
  rows[0].trigger = "timer";
  rows[0].per_minute = {3, 0, 4, 1};
  EXPECT_FALSE(burst_shapes_from_trace(rows, /*http_only=*/true, 1).ok());
  Result<std::vector<RateProcess>> shapes = burst_shapes_from_trace(rows, false, 1);
  ASSERT_TRUE(shapes.ok());
  EXPECT_EQ(shapes->size(), 1u);
  EXPECT_EQ(parse_arrival_pattern("azure").value(), ArrivalPattern::kAzure);
  EXPECT_FALSE(parse_arrival_pattern("azur").ok());
}

}  // namespace
}  // namespace hiber::sim
