// The paper's metrics, computed by hand: SLO compliance at p98, executed functions, GPU load
// and its per-node variance, latency quantiles.
#include <gtest/gtest.h>

#include <cmath>

#include "sim/metrics.h"

namespace hiber::sim {
namespace {

Workload two_functions() {
  Workload w;
  w.duration = 100 * kSecond;
  w.functions.push_back({"a", 0, 10, 80 * kMillisecond, 0.98});
  w.functions.push_back({"b", 0, 10, 80 * kMillisecond, 0.98});
  w.functions.push_back({"idle", 0, 10, 80 * kMillisecond, 0.98});
  return w;
}

Outcome done(uint32_t f, Time arrival, Duration latency) {
  Outcome o;
  o.function = f;
  o.arrival = arrival;
  o.finish = arrival + latency;
  o.completed = true;
  o.kind = StartKind::kResident;
  return o;
}

TEST(Recorder, AFunctionCompliesWhenItsP98IsWithinTheDeadline) {
  const Workload w = two_functions();
  Recorder rec(w, 10 * kSecond, 1, 4);
  // a: 50 requests, 49 within 80 ms: ceil(0.98 * 50) = 49 are needed, so it complies.
  for (int i = 0; i < 49; ++i) rec.record(done(0, 20 * kSecond + i, 10 * kMillisecond));
  rec.record(done(0, 30 * kSecond, 81 * kMillisecond));
  // b: 49 within, 1 never finished: 49 of 50 on time, complies; a second late one breaks it.
  for (int i = 0; i < 48; ++i) rec.record(done(1, 20 * kSecond + i, 80 * kMillisecond));
  Outcome unfinished;
  unfinished.function = 1;
  unfinished.arrival = 40 * kSecond;
  rec.record(unfinished);
  rec.record(done(1, 41 * kSecond, 200 * kMillisecond));
  // Warm-up requests do not count, however late.
  rec.record(done(0, 5 * kSecond, 10 * kSecond));
  const Results r = rec.results();
  EXPECT_EQ(r.functions_with_requests, 2);  // "idle" had none
  EXPECT_EQ(r.requests, 100u);
  EXPECT_EQ(r.completed, 99u);
  EXPECT_EQ(r.on_time, 97u);
  EXPECT_EQ(r.compliant, 1);
  EXPECT_EQ(r.executed, 2);
  EXPECT_DOUBLE_EQ(r.compliant_ratio, 0.5);
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kUnfinished)], 1u);
  // 100 latencies: 97 of <= 80 ms, 81 ms, 200 ms, +inf. p98 = 98th smallest = 81 ms; p99 = 200.
  EXPECT_FLOAT_EQ(static_cast<float>(r.latency.p98), 81.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(r.latency.p99), 200.0f);
  // Latency / deadline at the 127/128 quantile is the unfinished request's: +inf. The median is
  // 10 ms / 80 ms or 80 ms / 80 ms (a's and b's on-time requests): at most 1.
  EXPECT_TRUE(std::isinf(r.normalized_latency_quantiles.back()));
  EXPECT_LE(r.normalized_latency_quantiles[r.normalized_latency_quantiles.size() / 2], 1.0);
  EXPECT_EQ(r.normalized_quantile_levels.size(), 13u);  // 1/128 ... 1/2 ... 127/128
}

TEST(Recorder, GpuLoadIsTheBusyShareOfTheMeasuredWindow) {
  const Workload w = two_functions();  // measured window [10 s, 100 s): 90 s
  Recorder rec(w, 10 * kSecond, 1, 4);
  rec.add_busy(0, 0, 0, 100 * kSecond);            // clipped to 90 s: load 1
  rec.add_busy(0, 1, 10 * kSecond, 55 * kSecond);  // 45 s: 0.5
  rec.add_busy(0, 2, 50 * kSecond, 95 * kSecond);  // 45 s: 0.5
  const Results r = rec.results();
  EXPECT_DOUBLE_EQ(r.gpu_load[0], 1.0);
  EXPECT_DOUBLE_EQ(r.gpu_load[1], 0.5);
  EXPECT_DOUBLE_EQ(r.gpu_load[3], 0.0);
  // Normalised to the max: {1, .5, .5, 0}; mean .5; variance (.25 + 0 + 0 + .25) / 4.
  EXPECT_DOUBLE_EQ(r.node_load_variance[0], 0.125);
}

}  // namespace
}  // namespace hiber::sim
