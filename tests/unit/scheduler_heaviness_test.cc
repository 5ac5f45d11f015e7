// Heaviness: hints until measurements exist, the swap/exec ratio against the threshold, the
// paper's Table 4 labels from model sizes, and reclassification as measurements accumulate.
#include "scheduler/heaviness.h"

#include <gtest/gtest.h>

#include "scheduler/function_table.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

constexpr Duration kMs = kMillisecond;

TEST(HeavinessTest, RatioIsSwapOverExecAndInfiniteWithoutExec) {
  EXPECT_DOUBLE_EQ(HeavinessClassifier::ratio(30, 40), 0.75);
  EXPECT_EQ(HeavinessClassifier::ratio(5, 0), std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(HeavinessClassifier::ratio(0, 0), 0.0);
}

TEST(HeavinessTest, HintDecidesUntilBothKindsOfMeasurementReachTheMinimum) {
  HeavinessClassifier c(HeavinessOptions{});  // heavy_ratio 0.75, min_samples 3
  MovingMean swap, exec;
  HeavinessInputs in{&swap, &exec, /*heavy_hint=*/true, 0, 0};
  for (int i = 0; i < 3; ++i) swap.add(1 * kMs, 0.2);  // ratio would be tiny
  for (int i = 0; i < 2; ++i) exec.add(100 * kMs, 0.2);
  EXPECT_TRUE(c.heavy(in)) << "two executions are not enough to overrule the hint";
  exec.add(100 * kMs, 0.2);
  EXPECT_FALSE(c.heavy(in)) << "measured 1/100 < 0.75";
}

TEST(HeavinessTest, WithoutAHintTimeHintsDecideThenTheDefault) {
  HeavinessClassifier c(HeavinessOptions{});
  MovingMean none;
  EXPECT_TRUE(c.heavy(HeavinessInputs{&none, &none, std::nullopt, 75 * kMs, 100 * kMs}));
  EXPECT_FALSE(c.heavy(HeavinessInputs{&none, &none, std::nullopt, 74 * kMs, 100 * kMs}));
  EXPECT_FALSE(c.heavy(HeavinessInputs{&none, &none, std::nullopt, 75 * kMs, 0}));
  HeavinessOptions pessimist;
  pessimist.unknown_is_heavy = true;
  EXPECT_TRUE(
      HeavinessClassifier(pessimist).heavy(HeavinessInputs{&none, &none, std::nullopt, 0, 0}));
}

TEST(HeavinessTest, MovingMeanTakesTheFirstSampleThenWeighsNewOnesByAlpha) {
  MovingMean m;
  m.add(10, 0.2);
  EXPECT_DOUBLE_EQ(m.value, 10);
  m.add(20, 0.2);
  EXPECT_DOUBLE_EQ(m.value, 12);
  m.add(2, 0.5);
  EXPECT_DOUBLE_EQ(m.value, 7);
  EXPECT_EQ(m.samples, 3u);
}

// Torpor Table 4 on its V100 node (12 GB/s per PCIe switch), fp32 model sizes and the
// "GPU remoting" latency as the execution time: the models whose PCIe swap slows them by 40% or
// more (ResNet-50/101/152, Bert-qa) are heavy, the others light (heaviness.h derives this).
TEST(HeavinessTest, DefaultRatioReproducesTorporTable4Labels) {
  struct Model {
    const char* name;
    uint64_t bytes;
    Duration exec;
    bool heavy;
  };
  const Model models[] = {
      {"ResNet-50", 98'000'000, 9 * kMs, true},      {"ResNet-101", 170'000'000, 14 * kMs, true},
      {"ResNet-152", 230'000'000, 17 * kMs, true},   {"Bert-qa", 1'300'000'000, 43 * kMs, true},
      {"Inception-v3", 95'000'000, 14 * kMs, false}, {"DenseNet-169", 57'000'000, 25 * kMs, false},
      {"DenseNet-201", 80'000'000, 28 * kMs, false}, {"EfficientNet", 21'000'000, 12 * kMs, false},
  };
  FunctionTable table(WindowOptions{}, HeavinessOptions{}, /*host_gbps=*/12.0);
  uint32_t id = 1;
  for (const Model& m : models) {
    FunctionSpec s = testing::spec(m.bytes, 80 * kMs, m.exec);
    Result<FunctionIndex> f = table.add(FunctionId{id++}, s, 0);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(table.heavy(*f), m.heavy) << m.name;
  }
}

TEST(HeavinessTest, LabelFollowsMeasurementsAsTheyAccumulate) {
  FunctionTable table(WindowOptions{}, HeavinessOptions{}, 12.0);
  Result<FunctionIndex> r =
      table.add(FunctionId{1}, testing::spec(kGiB, 100 * kMs, 0, /*heavy=*/false), 0);
  ASSERT_TRUE(r.ok());
  const FunctionIndex f = *r;
  EXPECT_FALSE(table.heavy(f));  // the hint
  for (int i = 0; i < 3; ++i) table.record_host_swap(f, 30 * kMs);
  table.record_exec(f, 20 * kMs);
  table.record_exec(f, 20 * kMs);
  EXPECT_FALSE(table.heavy(f)) << "still the hint: two executions";
  table.record_exec(f, 20 * kMs);
  EXPECT_TRUE(table.heavy(f)) << "30 / 20 = 1.5 >= 0.75";
  // The model's inputs grow: executions of 100 ms move the mean 20 -> 36 -> 48.8.
  table.record_exec(f, 100 * kMs);
  EXPECT_TRUE(table.heavy(f)) << "30 / 36 = 0.83";
  table.record_exec(f, 100 * kMs);
  EXPECT_FALSE(table.heavy(f)) << "30 / 48.8 = 0.61";
}

TEST(HeavinessTest, AModelGrowingPastTheThresholdTurnsHeavyWithoutMeasurements) {
  FunctionTable table(WindowOptions{}, HeavinessOptions{}, 10.0);
  // 50 MB at 10 GB/s: a 5 ms swap against 10 ms of execution, light.
  Result<FunctionIndex> r =
      table.add(FunctionId{1}, testing::spec(50'000'000, 100 * kMs, 10 * kMs), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(table.heavy(*r));
  EXPECT_EQ(table.swap_estimate(*r), 5 * kMs);
  table.set_model_bytes(*r, 100'000'000);  // 10 ms swap: ratio 1
  EXPECT_TRUE(table.heavy(*r));
}

}  // namespace
}  // namespace hiber::scheduler
