#include "sim/exec_variation.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "scheduler/random.h"

namespace hiber::sim {

Duration ExecVariation::scale(Duration exec, ModelClass model_class, uint32_t function,
                              uint64_t n) const {
  const double cv = model_class == ModelClass::kLanguage ? language_cv : vision_cv;
  if (cv <= 0 || exec <= 0) return exec;
  scheduler::Rng rng(seed * 0x9e3779b97f4a7c15ULL ^ (uint64_t{function} << 40) ^ n);
  const double u1 = 1 - rng.uniform_double();  // (0, 1]: the logarithm stays finite
  const double z =
      std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * rng.uniform_double());
  // Log-normal with mean 1: sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2.
  const double s2 = std::log1p(cv * cv);
  const double factor = std::exp(std::sqrt(s2) * z - 0.5 * s2);
  return std::max<Duration>(
      1, static_cast<Duration>(std::llround(static_cast<double>(exec) * factor)));
}

}  // namespace hiber::sim
