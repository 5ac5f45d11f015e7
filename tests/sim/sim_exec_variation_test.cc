// Per-request execution-time variation (sim/exec_variation.h): log-normal factors with mean 1
// and the class's CV, the same for the same request whatever else happens.
#include <gtest/gtest.h>

#include <cmath>

#include "sim/exec_variation.h"

namespace hiber::sim {
namespace {

TEST(ExecVariation, MeanAndCvPerClass) {
  const ExecVariation v{0.05, 0.10, 3};
  const Duration exec = 43 * kMillisecond;
  for (ModelClass c : {ModelClass::kVision, ModelClass::kLanguage}) {
    const double cv = c == ModelClass::kLanguage ? 0.10 : 0.05;
    constexpr int kN = 200000;
    double sum = 0, sq = 0;
    for (int i = 0; i < kN; ++i) {
      const double x = static_cast<double>(v.scale(exec, c, i % 50, i / 50));
      sum += x;
      sq += x * x;
    }
    const double mean = sum / kN;
    const double sd = std::sqrt(sq / kN - mean * mean);
    EXPECT_NEAR(mean / static_cast<double>(exec), 1.0, 0.002) << model_class_name(c);
    EXPECT_NEAR(sd / mean, cv, 0.03 * cv) << model_class_name(c);
  }
}

TEST(ExecVariation, PureFunctionOfSeedFunctionAndNumber) {
  const ExecVariation v{0.05, 0.10, 3};
  const Duration exec = 17 * kMillisecond;
  EXPECT_EQ(v.scale(exec, ModelClass::kVision, 7, 11), v.scale(exec, ModelClass::kVision, 7, 11));
  EXPECT_NE(v.scale(exec, ModelClass::kVision, 7, 11), v.scale(exec, ModelClass::kVision, 7, 12));
  EXPECT_NE(v.scale(exec, ModelClass::kVision, 7, 11), v.scale(exec, ModelClass::kVision, 8, 11));
  const ExecVariation other{0.05, 0.10, 4};
  EXPECT_NE(v.scale(exec, ModelClass::kVision, 7, 11),
            other.scale(exec, ModelClass::kVision, 7, 11));
}

TEST(ExecVariation, ZeroCvKeepsTable4sTime) {
  const ExecVariation v{0, 0.10, 3};
  EXPECT_EQ(v.scale(25 * kMillisecond, ModelClass::kVision, 1, 2), 25 * kMillisecond);
  EXPECT_EQ(v.scale(0, ModelClass::kLanguage, 1, 2), 0);
}

}  // namespace
}  // namespace hiber::sim
