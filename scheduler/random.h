// The scheduler's only source of randomness: a seeded xoshiro256** generator.
//
// Written out here rather than taken from <random> because the standard distributions
// (uniform_int_distribution and friends) are implementation-defined: the same seed gives other
// decisions under libstdc++ and libc++. With this generator a seed names the same decisions on
// every platform, which the simulator's reproducibility depends on.
#pragma once

#include <cstdint>

namespace hiber::scheduler {

class Rng {
 public:
  // Expands the seed with splitmix64, as the xoshiro authors recommend, so seeds 0, 1, 2 give
  // unrelated streams.
  explicit Rng(uint64_t seed);

  uint64_t next();

  // Uniform in [0, n); 0 when n == 0. Lemire's multiply-shift with rejection: unbiased.
  uint64_t uniform(uint64_t n);

  // Uniform in [0, 1) with 53 random bits.
  double uniform_double();

 private:
  uint64_t s_[4];
};

}  // namespace hiber::scheduler
